"""The volume driver's queue on its own: split, put back, refuse (runner/volume_queue.py),
and the volume's time limit as the pilot stage's timeout."""

from __future__ import annotations

from runner.inputs import Item
from runner.spec import RunSpec
from runner.stage import STAGES_BY_NAME, stage_timeout
from runner.volume_queue import (
    DIED,
    HINTS_MAX,
    LATE,
    RAISED,
    TIMEOUT,
    Batch,
    BatchQueue,
    Split,
    refusal_reason,
)


def _items(n: int) -> list[Item]:
    return [Item(f"i{k}", f"/x/i{k}", 1) for k in range(n)]


def test_a_failed_batch_is_split_in_quarters_at_the_front_until_its_input_is_alone() -> None:
    """Quarters, not halves: as many calls to find the input, fewer executions (issue 34)."""
    queue = BatchQueue([Batch(0, _items(7)), Batch(1, _items(2))])
    bad = queue.take()
    split = queue.failed(bad, RAISED, "task.handler raised ValueError: x")
    assert split.parts == (2, 3, 4, 5) and not split.refused
    assert [[it.id for it in b.items] for b in queue.queue] == [
        ["i0", "i1"], ["i2", "i3"], ["i4", "i5"], ["i6"], ["i0", "i1"]]
    alone = Batch(9, _items(1))
    assert queue.failed(alone, RAISED, "task.handler raised ValueError: x").refused == (
        ("i0", "task.handler raised ValueError: x"),)
    assert queue.splits == 1 and len(queue) == 5


def test_a_batch_that_hung_is_run_one_input_a_batch_at_the_front() -> None:
    """A hang (the item clock, or the batch timeout): one more item timeout finds the input,
    the others run beside it, instead of a halving per item timeout (issue 37)."""
    for cause in (TIMEOUT, LATE):
        queue = BatchQueue([Batch(0, _items(5)), Batch(1, _items(2))])
        split = queue.failed(queue.take(), cause, "no result")
        assert split.parts == (2, 3, 4, 5, 6) and not split.refused
        assert [[it.id for it in b.items] for b in queue.queue] == [
            ["i0"], ["i1"], ["i2"], ["i3"], ["i4"], ["i0", "i1"]]
        assert queue.splits == 1


def test_a_lost_worker_s_batch_goes_back_whole_and_a_death_alone_is_tried_once_more() -> None:
    queue = BatchQueue([Batch(0, _items(4))])
    batch = queue.take()
    queue.put_back(batch)
    assert queue.take() is batch and batch.sent == 2
    alone = Batch(5, _items(1))
    first = queue.failed(alone, DIED, "ActorDiedError")
    assert first.retried and not first.refused and queue.take() is alone
    second = queue.failed(alone, DIED, "ActorDiedError")
    assert second.refused == (("i0", "ActorDiedError"),)


def test_refusal_reasons_name_the_timeout_or_the_exception() -> None:
    assert refusal_reason(TIMEOUT, "", item_timeout_s=2) == (
        "timeout: no result within task.item_timeout_s = 2 s (the handler was interrupted "
        "on its worker)")
    assert "batch timeout of 90 s" in refusal_reason(LATE, "", batch_timeout_s=90)
    assert refusal_reason(RAISED, "task.handler raised KeyError: 'x'") == (
        "task.handler raised KeyError: 'x'")
    assert refusal_reason(DIED, "ActorDiedError: gone").startswith("its worker died 2 times")


def test_the_volume_s_time_limit_is_its_driver_stage_s_timeout_not_the_pilot_s_hour() -> None:
    base = {"run_id": "r", "name": "n", "inputs": {"dir": "/x"},
            "diagnostics": {"timeouts": {"pilot": 1200}}}
    pilot = STAGES_BY_NAME["pilot"]
    assert stage_timeout(pilot, RunSpec.from_dict(base)) == 1200.0
    volume = RunSpec.from_dict({**base, "volume": {"time_limit_s": 36000}})
    assert stage_timeout(pilot, volume) == 36000.0
    assert stage_timeout(STAGES_BY_NAME["balance"], volume) == 600.0
    assert stage_timeout(pilot, RunSpec.from_dict({**base, "volume": {}})) == 1200.0


def test_the_suspect_is_tried_alone_and_the_inputs_around_it_go_back_a_batch_each() -> None:
    """What a failed call said (runner/handler_call.py): the inputs it yielded results for
    are recorded (``kept``) and leave the batch; the one it worked on when it raised goes
    alone; those it took before it and those it never reached are a batch each."""
    queue = BatchQueue([Batch(0, _items(8))])
    bad = queue.take()
    split = queue.failed(bad, RAISED, "boom", kept={"i0", "i1"}, suspect="i4")
    assert [[it.id for it in b.items] for b in queue.queue] == [
        ["i4"], ["i2", "i3"], ["i5", "i6", "i7"]]
    assert len(split.parts) == 3 and [b.hints for b in queue.queue] == [0, 1, 1]
    assert queue.failed(queue.take(), RAISED, "boom").refused == (("i4", "boom"),)
    # everything yielded: nothing left to run, nothing refused
    assert queue.failed(Batch(5, _items(2)), RAISED, "x", kept={"i0", "i1"}) == Split(())
    # one input left of a larger batch: tried alone before it is refused
    split = queue.failed(Batch(6, _items(3)), RAISED, "x", kept={"i0", "i2"}, suspect="i1")
    assert not split.refused and [it.id for it in queue.queue[0].items] == ["i1"]


def test_a_hung_input_named_by_the_call_goes_alone_and_the_rest_stays_together() -> None:
    queue = BatchQueue([Batch(0, _items(6))])
    queue.failed(queue.take(), TIMEOUT, "no result", kept={"i0"}, suspect="i3")
    assert [[it.id for it in b.items] for b in queue.queue] == [["i3"], ["i1", "i2"],
                                                                ["i4", "i5"]]
    # a hang the call cannot name, or the worker killed: each input alone, as before
    queue = BatchQueue([Batch(0, _items(3))])
    queue.failed(queue.take(), LATE, "held", suspect="i1")
    assert [[it.id for it in b.items] for b in queue.queue] == [["i0"], ["i1"], ["i2"]]


def test_a_lineage_that_used_its_suspects_is_split_blind() -> None:
    """A handler whose iteration misleads (it takes one item to look at, then indexes the
    batch) names a wrong suspect each time: after HINTS_MAX rounds, quarters again."""
    queue = BatchQueue([Batch(0, _items(40), hints=HINTS_MAX)])
    queue.failed(queue.take(), RAISED, "boom", suspect="i0")
    assert [len(b.items) for b in queue.queue] == [10, 10, 10, 10]
