"""The volume driver's queue on its own: split, put back, refuse (runner/volume_queue.py),
and the volume's time limit as the pilot stage's timeout."""

from __future__ import annotations

from runner.inputs import Item
from runner.spec import RunSpec
from runner.stage import STAGES_BY_NAME, stage_timeout
from runner.volume_queue import DIED, LATE, RAISED, TIMEOUT, Batch, BatchQueue, refusal_reason


def _items(n: int) -> list[Item]:
    return [Item(f"i{k}", f"/x/i{k}", 1) for k in range(n)]


def test_a_failed_batch_is_split_in_halves_at_the_front_until_its_input_is_alone() -> None:
    queue = BatchQueue([Batch(0, _items(5)), Batch(1, _items(2))])
    bad = queue.take()
    split = queue.failed(bad, RAISED, "task.handler raised ValueError: x")
    assert split.parts == (2, 3) and not split.refused
    assert [[it.id for it in b.items] for b in queue.queue] == [
        ["i0", "i1", "i2"], ["i3", "i4"], ["i0", "i1"]]
    alone = Batch(9, _items(1))
    assert queue.failed(alone, RAISED, "task.handler raised ValueError: x").refused == (
        ("i0", "task.handler raised ValueError: x"),)
    assert queue.splits == 1 and len(queue) == 3


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
