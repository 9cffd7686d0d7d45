"""The volume driver's bookkeeping against a small fake of the Ray calls it makes.

The fake implements exactly the surface the driver uses (``wait``, ``get``, ``kill``,
``nodes``, ``exceptions``) and runs each actor's batches one after another, as Ray runs
an actor's calls: an input can make its batch raise, time out on its worker, hang (the
worker never answers, as in native code a signal cannot interrupt) or kill its worker; a
worker can die with its node. Time is the driver's clock, moved on by the fake whenever
nothing is ready (no sleeping). The real engine is tested on Ray in tests/volume/.
"""

from __future__ import annotations

import threading
import types
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from runner.inputs import Item
from runner.ledger import Ledger, LedgerError
from runner.spec import RunSpec, batch_clock_s, healthy_cards
from runner.stage import StageContext, StageFailure
from runner.stages.pilot import Recorder
from runner.volume_driver import Driver
from runner.volume_queue import MIN_TIMEOUT_S, Batch
from runner.volume_workers import Worker
from tests.processes import wait_until


class ActorDiedError(Exception):
    pass


class Ref:
    def __init__(self, actor: FakeActor, payload: list[list[Any]] | None) -> None:
        self.actor, self.payload = actor, payload  # payload None: a where() call
        self.at = actor.ray.now  # when it was handed out


class FakeActor:
    def __init__(self, ray: FakeRay, key: int, node: str) -> None:
        self.ray, self.key, self.node = ray, key, node
        self.killed = False
        self.line: list[Ref] = []  # its calls, run one after another
        ray_ = ray
        actor = self

        class Run:
            def remote(self, payload: list[list[Any]],
                       ahead: list[list[list[Any]]] | None = None) -> Ref:
                ray_.calls.append((actor.key, [p[0] for p in payload]))
                ray_.aheads.append((actor.key, [[p[0] for p in b] for b in ahead or []]))
                ref = Ref(actor, payload)
                actor.line.append(ref)
                return ref

        class Where:
            def remote(self) -> Ref:
                return Ref(actor, None)

        self.run, self.where = Run(), Where()

    @property
    def dead(self) -> bool:
        return self.killed or self.node in self.ray.dead_nodes


class FakeRay:
    """``hang``: ids whose batch never answers; ``interrupted``: ids whose batch answers
    "timeout" once its item clock (``item_s`` × its items) ran out; ``raises``: ids whose
    batch raises;
    ``times_out``: ids whose batch runs past task.item_timeout_s on the worker;
    ``kills``: ids whose batch kills its worker (its node lives); ``dies``: workers whose
    node dies with their first batch."""

    exceptions = types.SimpleNamespace(ActorDiedError=ActorDiedError)

    def __init__(self, workers: int, *, hang: set[str] = frozenset(),  # type: ignore[assignment]
                 raises: set[str] = frozenset(), times_out: set[str] = frozenset(),  # type: ignore[assignment]
                 kills: set[str] = frozenset(), dies: set[int] = frozenset(),  # type: ignore[assignment]
                 interrupted: set[str] = frozenset(), item_s: float = 0.0,  # type: ignore[assignment]
                 pilot_item_s: float = 0.0) -> None:
        self.hang, self.raises, self.times_out = set(hang), set(raises), set(times_out)
        # ids that hang until the worker's item clock (item_s per item of the batch)
        # interrupts them: the batch answers "timeout" then
        self.interrupted, self.item_s = set(interrupted), item_s
        self.pilot_item_s = pilot_item_s
        self.kills, self.dies = set(kills), set(dies)
        self.dead_nodes: set[str] = set()
        self.partitioned: set[str] = set()
        self.calls: list[tuple[int, list[str]]] = []
        self.aheads: list[tuple[int, list[list[str]]]] = []  # what each call said comes next
        self.killed: list[int] = []
        self.now = 0.0
        self.actors = [FakeActor(self, k, f"node{k}") for k in range(workers)]

    def spawn(self, key: int) -> FakeActor:
        """A new actor where cards are free: on the node of a killed actor."""
        free = [a.node for a in self.actors if a.killed and a.node not in self.dead_nodes]
        actor = FakeActor(self, key, free[0] if free else f"node{key}")
        self.actors.append(actor)
        return actor

    def clock(self) -> float:
        return self.now

    def _ready(self, ref: Ref) -> bool:
        actor = ref.actor
        if actor.node in self.partitioned:
            return False
        if actor.dead or ref.payload is None:
            return True
        head = next((r for r in actor.line if not getattr(r, "done", False)), None)
        if head is not ref:
            return False  # behind another call of the same actor
        ids = {p[0] for p in ref.payload}
        if self.interrupted & ids:  # the worker's clock, as runner/itemtimeout.py arms it
            return self.now - ref.at >= batch_clock_s(len(ids), self.item_s, self.pilot_item_s)
        return not self.hang & ids

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        ready = [r for r in refs if self._ready(r)][:num_returns]
        if not ready:
            self.now += timeout  # nothing came back: time goes by
        return ready, [r for r in refs if r not in ready]

    def get(self, ref: Ref) -> dict[str, Any]:
        actor = ref.actor
        ref.done = True  # type: ignore[attr-defined]
        if ref.payload is None:
            return {"node": actor.node, "host": "h", "cards": [str(actor.key)]}
        ids = [p[0] for p in ref.payload]
        if actor.key in self.dies and not actor.dead:
            self.dead_nodes.add(actor.node)
        if not actor.dead and self.kills & set(ids):
            actor.killed = True
        if actor.dead:
            raise ActorDiedError(f"the actor w{actor.key} died")
        if self.raises & set(ids):
            return {"error": "task.handler raised ValueError: bad input "
                             f"{sorted(self.raises & set(ids))[0]}", "cause": "raised"}
        if (self.times_out | self.interrupted) & set(ids):
            return {"error": "no result within task.item_timeout_s = 1 s per item",
                    "cause": "timeout"}
        return {"results": [{"id": i, "status": "accepted", "category": "x"} for i in ids],
                "seconds": 0.01}

    def kill(self, actor: FakeActor, no_restart: bool = True) -> None:
        actor.killed = True
        self.killed.append(actor.key)

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": n, "Alive": n not in self.dead_nodes | self.partitioned}
                for n in sorted({a.node for a in self.actors})]


def _driver(tmp_path: Path, ray: FakeRay, count: int, timeout: float = 0.0, size: int = 5,
            **options: Any) -> tuple[Driver, Ledger, list[Any]]:
    spec = RunSpec.from_dict({"run_id": "r", "name": "n", "inputs": {"dir": str(tmp_path)},
                              "task": {"categories": ["x"]}})
    events: list[Any] = []
    ctx = StageContext(spec=spec, run_dir=str(tmp_path),
                       emit=lambda etype, **data: events.append((etype, data)))
    items = [Item(f"i{n:03d}", str(tmp_path / f"i{n:03d}"), 1) for n in range(count)]
    ledger = Ledger.open(str(tmp_path / "ledger.sqlite"), new_attempt=True)
    workers = [Worker(a.key, a, node=a.node, host="h", cards=[str(a.key)])
               for a in ray.actors]
    batches = [Batch(n, items[i:i + size]) for n, i in enumerate(range(0, count, size))]
    options.setdefault("spawn", ray.spawn)
    return Driver(ctx, Recorder(ctx, ledger, items, set()), ray, workers, batches,
                  timeout, clock=ray.clock, **options), ledger, events


def _every_id_once(ledger: Ledger, count: int) -> dict[str, Any]:
    rows = {r.id: r for r in ledger.rows()}
    assert ledger.count() == count and sorted(rows) == [f"i{n:03d}" for n in range(count)]
    return rows


def test_a_lost_node_s_batches_go_to_the_others_and_every_id_is_recorded_once(
        tmp_path: Path) -> None:
    ray = FakeRay(3, dies={1})
    driver, ledger, events = _driver(tmp_path, ray, 40, in_flight=2)
    facts = driver.run()
    rows = _every_id_once(ledger, 40)
    assert {r.status for r in rows.values()} == {"accepted"}
    assert facts["workers_lost"] == 1 and facts["nodes_lost"] == 1
    assert facts["batches_split"] == 0 and facts["re_executed"] == 0
    lost = [d for e, d in events if e == "volume.node_lost"]
    assert len(lost) == 1 and lost[0]["node"] == "node1" and lost[0]["host"] == "h"
    assert "ActorDiedError" in lost[0]["reason"] and lost[0]["workers"] == ["w1@h[1]"]
    assert [e for e, _ in events].count("volume.requeued") == 2  # its two batches in flight
    assert [k for k, _ in ray.calls].count(1) == 2  # nothing more to it


def test_a_node_gone_from_the_cluster_is_dropped_before_any_call_fails(
        tmp_path: Path) -> None:
    ray = FakeRay(2)
    ray.partitioned.add("node0")  # its calls never answer; ray.nodes() says it is gone
    driver, ledger, events = _driver(tmp_path, ray, 20, timeout=3600)
    facts = driver.run()
    _every_id_once(ledger, 20)
    assert facts["nodes_lost"] == 1 and facts["workers_excluded"] == 0
    lost = [d for e, d in events if e == "volume.node_lost"]
    assert [d["node"] for d in lost] == ["node0"] and "left the Ray cluster" in lost[0]["reason"]
    assert ray.now < 3600  # it did not wait for the batch timeout


def test_a_hung_input_is_isolated_and_refused_without_excluding_every_worker(
        tmp_path: Path) -> None:
    """The issue's simulation: one input that never returns used to exclude 8/8 workers
    and leave 792/800 recorded, on every resume again."""
    ray = FakeRay(8, hang={"i417"})
    driver, ledger, events = _driver(tmp_path, ray, 800, timeout=120, size=25)
    facts = driver.run()
    rows = _every_id_once(ledger, 800)
    assert rows["i417"].status == "refused"
    assert "batch timeout of 120 s" in (rows["i417"].reason or "")
    assert all(r.status == "accepted" for i, r in rows.items() if i != "i417")
    # a hang: its batch of 25 run one input a batch, the hung one alone excluded once more
    # (it was bisected 25 -> 13 -> 7 -> 4 -> 2 -> 1, a worker excluded at each level)
    assert facts["workers_excluded"] == 2 and facts["batches_split"] == 1
    assert facts["refused_alone"] == 1 and len(ray.actors) == 8 + 2  # two started again ...
    assert facts["workers_started_again"] == 1  # ... the last one after the work was done,
    unused = ray.actors[-1].key  # so it was stopped unused
    assert sorted(ray.killed) == sorted([w.key for w in driver.workers if w.excluded] + [unused])
    excluded = [d for e, d in events if e == "volume.card_excluded"]
    assert len(excluded) == 2 and all("cards freed" in d["reason"] for d in excluded)
    split = [d for e, d in events if e == "volume.split"]
    assert split[-1]["refused"] == [{"id": "i417", "reason": rows["i417"].reason}]


def test_a_hung_input_on_two_workers_is_isolated_by_workers_started_again(
        tmp_path: Path) -> None:
    ray = FakeRay(2, hang={"i021"})
    driver, ledger, _ = _driver(tmp_path, ray, 64, timeout=60, size=16)
    facts = driver.run()  # 16 -> 16 of one: two workers stopped (it was 16 -> 8 -> ... -> 1: 5)
    rows = _every_id_once(ledger, 64)
    assert rows["i021"].status == "refused" and facts["workers_excluded"] == 2
    assert sum(r.status == "accepted" for r in rows.values()) == 63


def test_a_raising_input_is_refused_with_its_exception_and_the_volume_goes_on(
        tmp_path: Path) -> None:
    ray = FakeRay(2, raises={"i013"})
    driver, ledger, _ = _driver(tmp_path, ray, 40, size=8)
    facts = driver.run()
    rows = _every_id_once(ledger, 40)
    assert rows["i013"].status == "refused"
    assert rows["i013"].reason == "task.handler raised ValueError: bad input i013"
    assert Counter(r.status for r in rows.values()) == {"accepted": 39, "refused": 1}
    assert facts["workers_excluded"] == 0 and facts["workers_lost"] == 0
    assert facts["batches_split"] == 2  # 8 -> quarters of 2 -> 1 (issue 34)


def test_an_input_past_item_timeout_on_its_worker_is_refused_naming_the_timeout(
        tmp_path: Path) -> None:
    ray = FakeRay(2, times_out={"i007"})
    driver, ledger, _ = _driver(tmp_path, ray, 20, item_timeout_s=1.0)
    driver.run()
    rows = _every_id_once(ledger, 20)
    assert rows["i007"].status == "refused"
    assert rows["i007"].reason == ("timeout: no result within task.item_timeout_s = 1 s "
                                   "(the handler was interrupted on its worker)")
    assert sum(r.status == "refused" for r in rows.values()) == 1


def test_an_input_that_kills_its_worker_is_refused_after_two_deaths_alone(
        tmp_path: Path) -> None:
    ray = FakeRay(3, kills={"i004"})
    driver, ledger, events = _driver(tmp_path, ray, 15, size=5)
    facts = driver.run()
    rows = _every_id_once(ledger, 15)
    assert rows["i004"].status == "refused"
    assert (rows["i004"].reason or "").startswith("its worker died 2 times while running it")
    # three deaths: its batch of 5 (split in quarters, issue 34; halves took four), then
    # twice alone; the third worker started in place was not needed any more
    assert facts["workers_lost"] == 3 and facts["nodes_lost"] == 0
    assert facts["workers_started_again"] >= 2
    assert not [e for e, _ in events if e == "volume.node_lost"]


def test_a_handler_that_fails_on_many_inputs_fails_the_volume(tmp_path: Path) -> None:
    ray = FakeRay(2, raises={f"i{n:03d}" for n in range(0, 60)})
    driver, ledger, _ = _driver(tmp_path, ray, 100)
    with pytest.raises(StageFailure, match=r"21 inputs failed alone \(more than 20\)"):
        driver.run()
    assert ledger.count() >= 21  # the refusals so far are kept


def test_every_worker_lost_fails_naming_what_is_left(tmp_path: Path) -> None:
    driver, ledger, _ = _driver(tmp_path, FakeRay(2, dies={0, 1}), 30)
    with pytest.raises(StageFailure, match="every worker of the volume was lost or "
                                           r"excluded with \d batch\(es\) left"):
        driver.run()
    assert ledger.count() == 0


def test_each_worker_holds_two_batches_at_once(tmp_path: Path) -> None:
    ray = FakeRay(3)
    driver, ledger, _ = _driver(tmp_path, ray, 60, in_flight=2)
    driver._hand_out()
    assert [k for k, _ in ray.calls] == [0, 1, 2, 0, 1, 2]
    driver.run()
    _every_id_once(ledger, 60)
    (tmp_path / "one").mkdir()
    one = FakeRay(3)
    single, _, _ = _driver(tmp_path / "one", one, 60, in_flight=1)
    single._hand_out()
    assert [k for k, _ in one.calls] == [0, 1, 2]


def test_the_batch_timeout_before_any_batch_finished_is_the_pilot_s_batch_time(
        tmp_path: Path) -> None:
    ray = FakeRay(1)
    driver, _, _ = _driver(tmp_path, ray, 5, pilot_batch_s=9.0)
    assert driver.timeout() == 90.0  # ten times the pilot's batch, not 60 s
    driver.slowest = max(driver.slowest, 12.0)  # a batch of 12 s came back
    assert driver.timeout() == 120.0
    (tmp_path / "b").mkdir()
    bare, _, _ = _driver(tmp_path / "b", FakeRay(1), 5)
    assert bare.timeout() == MIN_TIMEOUT_S
    (tmp_path / "c").mkdir()
    fixed, _, _ = _driver(tmp_path / "c", FakeRay(1), 5, timeout=300, pilot_batch_s=90.0)
    assert fixed.timeout() == 300.0  # volume.batch_timeout_s, as the manifest set it


def test_a_slow_first_batch_within_the_pilot_s_measure_excludes_no_worker(
        tmp_path: Path) -> None:
    """A handler whose batch takes 90 s: with the pilot's 90 s batch the first batches
    are not late (they were at the fixed 60 s)."""
    ray = FakeRay(2, hang={"i000", "i005"})
    driver, ledger, _ = _driver(tmp_path, ray, 10, pilot_batch_s=90.0)
    wait = ray.wait

    def slow_wait(refs: list[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        if ray.now >= 90.0:
            ray.hang.clear()  # both first batches answer after 90 s
        return wait(refs, num_returns, timeout)

    ray.wait = slow_wait  # type: ignore[method-assign]
    facts = driver.run()
    _every_id_once(ledger, 10)
    assert facts["workers_excluded"] == 0 and facts["batches_split"] == 0


def test_the_volume_uses_the_latest_card_stage_s_healthy_cards() -> None:
    facts = {"device": {"healthy_cards": [0, 1, 2, 3]}, "compute": {"healthy_cards": [0, 2, 3]},
             "interconnect": {}}
    assert healthy_cards(facts) == [0, 2, 3]
    assert healthy_cards({"device": {"device": "cpu"}}) is None


def test_the_volume_and_the_bot_read_healthy_cards_by_one_rule() -> None:
    """A boolean is no card index (JSON's true is not card 1): the runner's volume and the
    bot's report read a stage's healthy_cards alike, from runner.spec's one rule."""
    from bot.pilot.cards import healthy_cards as bot_healthy_cards

    for cards, expected in (([True, 1], None), (["0"], None), ([3, 1], [1, 3]), ([], [])):
        facts = {"compute": {"healthy_cards": cards}}
        assert healthy_cards(facts) == expected
        assert bot_healthy_cards([{"stage": "compute", "facts": facts["compute"]}]) == expected


class SlowToNotice(FakeRay):
    """Ray's GCS notices a dead node late: the first look after its workers' calls failed
    still finds it alive (the real cluster: a raylet killed, its actors' calls fail at
    once with ActorUnavailableError, the node is marked dead seconds later)."""

    def __init__(self, workers: int, **kw: Any) -> None:
        super().__init__(workers, **kw)
        self.looks: Counter[str] = Counter()

    def nodes(self) -> list[dict[str, Any]]:
        out = super().nodes()
        for n in out:
            if not n["Alive"]:
                self.looks[n["NodeID"]] += 1
                n["Alive"] = self.looks[n["NodeID"]] == 1
        return out


def test_a_node_noticed_dead_after_its_workers_were_lost_is_still_reported_lost(
        tmp_path: Path) -> None:
    """Its workers were lost as dead workers (the node still looked alive): when the node
    leaves the cluster, the thread is still told which node was lost."""
    ray = SlowToNotice(3, dies={1}, hang={"i039"})
    driver, ledger, events = _driver(tmp_path, ray, 40, timeout=30, in_flight=2)
    facts = driver.run()
    _every_id_once(ledger, 40)
    lost = [d for e, d in events if e == "volume.node_lost"]
    assert [d["node"] for d in lost] == ["node1"], events
    assert "left the Ray cluster" in lost[0]["reason"] and lost[0]["workers"] == ["w1@h[1]"]
    assert facts["nodes_lost"] == 1
    assert [d["worker"] for e, d in events if e == "volume.worker_lost"] == ["w1@h[1]"]


class ActorUnavailableError(Exception):
    pass


class RayletKilled(SlowToNotice):
    """A raylet SIGKILLed (as ``ray.cluster_utils.Cluster.remove_node`` does): every call
    on its actors fails at once with ActorUnavailableError (Ray 2.60, seen on a real
    cluster) while the first look at ``ray.nodes()`` still finds the node alive."""

    exceptions = types.SimpleNamespace(ActorDiedError=ActorDiedError,
                                       ActorUnavailableError=ActorUnavailableError)

    def get(self, ref: Ref) -> dict[str, Any]:
        try:
            return super().get(ref)
        except ActorDiedError as exc:
            if ref.actor.node not in self.dead_nodes:
                raise
            raise ActorUnavailableError(
                f"The actor a{ref.actor.key} is unavailable: The actor is temporarily "
                "unavailable: RpcError: RPC error: Socket closed rpc_code: 14. The task may "
                "or may not have been executed on the actor.") from exc


def test_a_killed_raylet_s_batches_in_flight_go_back_whole_not_split(tmp_path: Path) -> None:
    """Issue 23: a node lost is not a batch that failed because of what it holds. Both
    batches in flight on the lost worker (volume.in_flight 2) go back whole, at the front,
    and no batch is split, though the node still looked alive when the calls failed."""
    ray = RayletKilled(3, dies={1})
    driver, ledger, events = _driver(tmp_path, ray, 40, in_flight=2)
    facts = driver.run()
    rows = _every_id_once(ledger, 40)
    assert {r.status for r in rows.values()} == {"accepted"}
    assert facts["batches_split"] == 0 and not [e for e, _ in events if e == "volume.split"]
    requeued = [d for e, d in events if e == "volume.requeued"]
    assert len(requeued) == 2 and {d["items"] for d in requeued} == {5}  # whole batches
    assert all("ActorUnavailableError" in d["reason"] for d in requeued)
    lost = [d for e, d in events if e == "volume.node_lost"]
    assert [d["node"] for d in lost] == ["node1"] and facts["nodes_lost"] == 1
    assert [k for k, _ in ray.calls].count(1) == 2  # nothing more handed to it


def test_an_actor_dead_with_its_node_goes_back_whole_while_the_node_looks_alive(
        tmp_path: Path) -> None:
    """Ray's own word for it (the GCS's death cause: 'its node has died') is enough; the
    batch is not split even before ray.nodes() says the node is gone."""
    class NodeDied(SlowToNotice):
        def get(self, ref: Ref) -> dict[str, Any]:
            try:
                return super().get(ref)
            except ActorDiedError as exc:
                raise ActorDiedError("The actor died unexpectedly before finishing this "
                                     "task.\nThe actor died because its node has died. Node "
                                     f"Id: {ref.actor.node}") from exc

    ray = NodeDied(2, dies={0})
    driver, ledger, events = _driver(tmp_path, ray, 20, in_flight=2)
    facts = driver.run()
    _every_id_once(ledger, 20)
    assert facts["batches_split"] == 0 and facts["nodes_lost"] == 1
    assert [d["items"] for e, d in events if e == "volume.requeued"] == [5, 5]


def test_an_input_whose_node_dies_twice_under_it_is_not_refused(tmp_path: Path) -> None:
    """A batch re-queued because its node died is not counted against its inputs: one
    input alone, lost with two nodes in turn, is run a third time and recorded."""
    ray = RayletKilled(3, dies={0, 1})
    driver, ledger, events = _driver(tmp_path, ray, 1, size=1)
    facts = driver.run()
    rows = _every_id_once(ledger, 1)
    assert rows["i000"].status == "accepted" and facts["refused_alone"] == 0
    assert [e for e, _ in events].count("volume.requeued") == 2
    assert [k for k, _ in ray.calls] == [0, 1, 2]


class NewestFirst(FakeRay):
    """An input that kills its worker does so as the worker runs it (every call of the
    actor then fails at once), and ``ray.wait`` names what is ready newest first (nothing
    promises the order)."""

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        for actor in self.actors:
            head = next((r for r in actor.line if not getattr(r, "done", False)), None)
            if head is not None and head.payload and self.kills & {p[0] for p in head.payload}:
                actor.killed = True
        ready = [r for r in reversed(refs) if self._ready(r)][:num_returns]
        if not ready:
            self.now += timeout
        return ready, [r for r in refs if r not in ready]


def test_a_worker_killed_by_an_input_blames_the_batch_it_ran_not_the_one_queued_behind(
        tmp_path: Path) -> None:
    """volume.in_flight 2: the worker's second batch never ran; it goes back whole, and
    only the batch the worker was running when it died is split."""
    ray = NewestFirst(2, kills={"i002"})
    driver, ledger, events = _driver(tmp_path, ray, 40, in_flight=2)
    driver.run()
    rows = _every_id_once(ledger, 40)
    assert rows["i002"].status == "refused"
    split = [d for e, d in events if e == "volume.split"]
    assert split[0]["batch"] == 0 and split[0]["cause"] == "died"  # i000-i004
    assert all(d["items"] <= 5 and d["batch"] != 2 for d in split)
    requeued = [d for e, d in events if e == "volume.requeued"]
    assert requeued[0]["batch"] == 2 and requeued[0]["items"] == 5  # the one behind it


def test_ray_s_own_errors_tell_a_lost_node_from_a_worker_that_died() -> None:
    """The classification on Ray's real exception types and the GCS's death causes (the
    texts Ray 2.60 writes): a node unreachable or dead, or a worker stopped from outside,
    is none of its batch's doing; a worker process that died on a live node may be."""
    from ray import exceptions as rex

    from runner.volume_workers import KILLED_OUTSIDE, NODE_DIED, NODE_UNREACHABLE, outside_cause

    unavailable = rex.ActorUnavailableError(
        "The actor is temporarily unavailable: RpcError: RPC error: Socket closed", None)
    assert outside_cause(unavailable) == NODE_UNREACHABLE
    assert outside_cause(rex.NodeDiedError("node n1 is dead")) == NODE_UNREACHABLE
    assert outside_cause(rex.ActorDiedError()) is None  # the cause is not known
    died = "The actor died unexpectedly before finishing this task.\n{}"
    for text, expected in (
            ("The actor died because its node has died. Node Id: ab12", NODE_DIED),
            ("The actor is dead because it was killed by `ray.kill`.", KILLED_OUTSIDE),
            ("The actor is dead because its worker process has died. Worker exit type: "
             "SYSTEM_ERROR Worker exit detail: Worker unexpectedly exits with a connection "
             "error code 2. End of file.", None)):
        exc = rex.RayActorError(error_msg=died.format(text))
        assert outside_cause(exc) == expected, text


def test_with_the_defaults_a_hung_input_is_interrupted_before_any_worker_is_stopped(
        tmp_path: Path) -> None:
    """The issue's case: a batch of 25, 5 s per item, the pilot's 0.01 s p90 per item. The
    worker's clock gives one item the 5 s and each other 10 × 0.01 s (7.4 s in all, not
    25 × 5 s, which outlasted the 60 s batch timeout): the hung input is interrupted, run
    alone, refused in about one item timeout more, and no worker is stopped (issue 37)."""
    ray = FakeRay(4, interrupted={"i417"}, item_s=5.0, pilot_item_s=0.01)
    driver, ledger, _ = _driver(tmp_path, ray, 800, size=25, item_timeout_s=5.0,
                                pilot_item_s=0.01, pilot_batch_s=0.25)
    facts = driver.run()
    rows = _every_id_once(ledger, 800)
    assert rows["i417"].status == "refused"
    assert rows["i417"].reason == ("timeout: no result within task.item_timeout_s = 5 s "
                                   "(the handler was interrupted on its worker)")
    assert facts["workers_excluded"] == 0 and facts["workers_lost"] == 0
    assert ray.killed == [] and len(ray.actors) == 4
    assert ray.now < 7.4 + 5 + 2  # its batch's clock, then one item timeout alone
    assert driver.timeout(25) == MIN_TIMEOUT_S  # the clock + 10 s is well within it
    # an item timeout of 300 s: the batch timeout waits for the clock (300 + 24 × 0.1 s)
    (tmp_path / "b").mkdir()
    slow, _, _ = _driver(tmp_path / "b", FakeRay(1), 25, size=25, item_timeout_s=300.0,
                         pilot_item_s=0.01)
    assert slow.timeout(25) == pytest.approx(300 + 24 * 0.1 + 10)


def test_the_progress_admits_a_batch_held_far_longer_than_a_batch_takes(
        tmp_path: Path) -> None:
    """Stuck in native code (no interrupt): "ETA 1 s" for minutes became "1 batch held for
    45 s": the progress says how many batches are held, for how long, and until when."""
    ray = FakeRay(4, hang={"i417"})
    driver, _, events = _driver(tmp_path, ray, 800, size=25, pilot_batch_s=0.25)
    driver.run()
    held = [d for e, d in events if e == "progress" and d.get("held")]
    assert held and held[-1]["held"] == 1 and held[-1]["held_s"] > 10
    assert held[-1]["held_limit_s"] == MIN_TIMEOUT_S


def test_with_read_ahead_each_call_names_the_batch_its_worker_runs_next(
        tmp_path: Path) -> None:
    """``volume.prefetch``: each call carries the batches reserved for its worker, and the
    worker's next call is exactly that one; a worker lost with its node gives its reserved
    batch back, and every id is recorded once (issue 34, point 5)."""
    ray = FakeRay(3, dies={2})
    driver, ledger, _ = _driver(tmp_path, ray, 60, in_flight=2, prefetch=1)
    facts = driver.run()
    _every_id_once(ledger, 60)
    assert facts["prefetch"] == 1 and facts["workers_lost"] == 1
    for key in (0, 1):
        runs = [ids for k, ids in ray.calls if k == key]
        said = [ahead for k, ahead in ray.aheads if k == key]
        assert len(runs) > 3
        for n in range(len(runs) - 1):
            assert said[n] in ([runs[n + 1]], [])  # the next one, unless it went elsewhere
    assert sum(len(ahead) == 1 for k, ahead in ray.aheads if k in (0, 1)) > 4


class SlowDisk:
    """The pilot stage's Recorder behind a disk that answers when ``open`` is set, and
    fails with ``fail`` after ``ok`` batches when given."""

    def __init__(self, inner: Recorder, ok: int = -1, fail: Exception | None = None) -> None:
        self.inner, self.ok, self.fail = inner, ok, fail
        self.open = threading.Event()
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def record_first_wins(self, asked: Any, results: Any, elapsed_s: Any = None) -> Any:
        assert self.open.wait(30)
        self.calls += 1
        if self.fail is not None and self.calls > self.ok:
            raise self.fail
        return self.inner.record_first_wins(asked, results, elapsed_s=elapsed_s)


def test_the_driver_hands_out_every_batch_while_the_disk_is_slow(tmp_path: Path) -> None:
    """Recording is off the hand-out loop (issue 34): with the ledger's disk stuck, every
    batch is still handed out; once it answers, all of them are recorded before the pass
    returns."""
    ray = FakeRay(2)
    driver, ledger, _ = _driver(tmp_path, ray, 40, size=5, in_flight=2)
    disk = SlowDisk(driver.recorder)  # type: ignore[arg-type]
    driver.recorder = disk  # type: ignore[assignment]
    passed: list[Any] = []
    runner_ = threading.Thread(target=lambda: passed.append(driver.run()))
    runner_.start()
    wait_until(lambda: len(ray.calls) == 8, "every batch handed out", 30)
    assert disk.calls == 0 and ledger.count() == 0
    disk.open.set()
    runner_.join(30)
    assert passed and ledger.count() == 40 and passed[0]["re_executed"] == 0
    assert passed[0]["recording_s"] > 0  # the pass's facts say how long it recorded


def test_a_ledger_that_fails_fails_the_pass_naming_it_and_keeps_what_was_recorded(
        tmp_path: Path) -> None:
    ray = FakeRay(2)
    driver, ledger, _ = _driver(tmp_path, ray, 40, size=5)
    disk = SlowDisk(driver.recorder, ok=3, fail=LedgerError("ledger x: disk I/O error"))  # type: ignore[arg-type]
    disk.open.set()
    driver.recorder = disk  # type: ignore[assignment]
    with pytest.raises(StageFailure, match="the results could not be recorded: LedgerError: "
                                           "ledger x: disk I/O error") as failed:
        driver.run()
    assert "preflight resume RUN" in (failed.value.hint or "")
    assert ledger.count() == 15  # the three batches recorded before it failed


def test_the_per_worker_rates_ride_on_a_progress_event_every_30_s_or_when_workers_change(
        tmp_path: Path) -> None:
    """80 workers made a 3 KB progress line every second (issue 34): the rates of each
    worker now come every 30 s, when a worker is lost or started, and at the end."""
    ray = FakeRay(4, hang={"i417"})
    driver, _, events = _driver(tmp_path, ray, 800, size=25, pilot_batch_s=0.25)
    driver.run()
    progress = [d for e, d in events if e == "progress"]
    rates = [d for d in progress if "per_card" in d]
    assert len(progress) > 3 * len(rates) and rates[-1] is progress[-1]
    assert progress[-1]["done"] == 800  # the last one once every result is recorded
    for before, now in zip(rates, rates[1:-1]):
        assert now["running_s"] - before["running_s"] >= 30 or \
            sorted(now["per_card"]) != sorted(before["per_card"])
    assert any(sorted(a["per_card"]) != sorted(b["per_card"]) for a, b in zip(rates, rates[1:]))
