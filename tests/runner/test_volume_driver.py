"""The volume driver's bookkeeping against a small fake of the Ray calls it makes.

The fake implements exactly the surface the driver uses (``wait``, ``get``, ``nodes``,
``exceptions``); each worker's batches finish in a scripted order, die with their worker,
or hang. The real engine is tested on Ray in tests/volume/.
"""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from runner.inputs import Item
from runner.ledger import Ledger
from runner.spec import RunSpec
from runner.stages import StageContext, StageFailure
from runner.stages.pilot import Recorder
from runner.volume import Batch, Driver, Worker, healthy_cards


class ActorDiedError(Exception):
    pass


class Ref:
    def __init__(self, worker: int, payload: list[list[Any]]) -> None:
        self.worker, self.payload = worker, payload


class FakeRay:
    """Workers answer in the order scripted: ``behaviour[worker]`` is "ok", "dies" or
    "hangs-once" (its first batch answers only after every other batch)."""

    exceptions = types.SimpleNamespace(ActorDiedError=ActorDiedError)

    def __init__(self, behaviour: dict[int, str]) -> None:
        self.behaviour = behaviour
        self.dead_nodes: set[str] = set()
        self.hung: list[Ref] = []
        self.calls: list[tuple[int, list[str]]] = []

    def actor(self, key: int) -> Any:
        ray = self

        class Method:
            def remote(self, payload: list[list[Any]]) -> Ref:
                ray.calls.append((key, [p[0] for p in payload]))
                return Ref(key, payload)

        return types.SimpleNamespace(run=Method())

    def wait(self, refs: list[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        for ref in refs:
            mode = self.behaviour[ref.worker]
            if mode == "hangs-once" and ref not in self.hung and not self.hung:
                self.hung.append(ref)
            if ref in self.hung and len(refs) > 1:
                continue
            return [ref], []
        return [], refs

    def get(self, ref: Ref) -> dict[str, Any]:
        if self.behaviour[ref.worker] == "dies":
            self.dead_nodes.add(f"node{ref.worker}")
            raise ActorDiedError("the actor's node died")
        return {"results": [{"id": i, "status": "accepted", "category": "x"}
                            for i, _p, _s in ref.payload], "seconds": 0.01}

    def nodes(self) -> list[dict[str, Any]]:
        return [{"NodeID": f"node{k}", "Alive": f"node{k}" not in self.dead_nodes}
                for k in self.behaviour]


def _driver(tmp_path: Path, ray: FakeRay, count: int, timeout: float = 0.0,
            ) -> tuple[Driver, Ledger, list[Any]]:
    spec = RunSpec.from_dict({"run_id": "r", "name": "n", "inputs": {"dir": str(tmp_path)},
                              "task": {"categories": ["x"]}})
    events: list[Any] = []
    ctx = StageContext(spec=spec, run_dir=str(tmp_path),
                       emit=lambda etype, **data: events.append((etype, data)))
    items = [Item(f"i{n:03d}", f"/x/i{n:03d}", 1) for n in range(count)]
    ledger = Ledger.open(str(tmp_path / "ledger.sqlite"), new_attempt=True)
    workers = [Worker(k, ray.actor(k), node=f"node{k}", host="h", cards=[str(k)])
               for k in ray.behaviour]
    batches = [Batch(n, items[i:i + 5]) for n, i in enumerate(range(0, count, 5))]
    return Driver(ctx, Recorder(ctx, ledger, items, set()), ray, workers, batches,
                  timeout), ledger, events


def test_a_lost_node_s_batch_is_requeued_and_every_id_recorded_once(tmp_path: Path) -> None:
    ray = FakeRay({0: "ok", 1: "dies", 2: "ok"})
    driver, ledger, events = _driver(tmp_path, ray, 40)
    facts = driver.run()
    assert ledger.count() == 40 and sorted(ledger.done_ids()) == [f"i{n:03d}" for n in range(40)]
    assert facts["workers_lost"] == 1 and facts["nodes_lost"] == 1
    assert facts["batches_requeued"] == 1 and facts["re_executed"] == 0
    kinds = [e for e, _ in events]
    assert kinds.count("volume.node_lost") == 1 and kinds.count("volume.requeued") == 1
    assert all(k != 1 for k, _ in ray.calls[3:])  # the lost worker got nothing more


def test_a_late_batch_is_done_again_elsewhere_and_counted_once(tmp_path: Path) -> None:
    ray = FakeRay({0: "hangs-once", 1: "ok"})
    driver, ledger, events = _driver(tmp_path, ray, 20, timeout=1e-9)
    facts = driver.run()
    assert ledger.count() == 20
    excluded = [d for e, d in events if e == "volume.card_excluded"]
    assert [d["worker"] for d in excluded] == ["w0@h[0]"]
    # the driver did not wait for the hung batch: its late answer never came here
    assert facts["re_executed"] == 0 and facts["workers_excluded"] == 1
    late = Ref(0, [[f"i{n:03d}", "", 1] for n in range(5)])
    new, again = driver.recorder.record_first_wins([p[0] for p in late.payload],
                                                   ray.get(late)["results"])
    assert (new, again) == (0, 5) and ledger.count() == 20 and ledger.re_executed() == 5


def test_every_worker_lost_fails_naming_what_is_left(tmp_path: Path) -> None:
    driver, ledger, _ = _driver(tmp_path, FakeRay({0: "dies", 1: "dies"}), 30)
    with pytest.raises(StageFailure, match="every worker of the volume was lost or "
                                           r"excluded with \d batch\(es\) left"):
        driver.run()
    assert ledger.count() == 0


def test_the_volume_uses_the_latest_card_stage_s_healthy_cards() -> None:
    facts = {"device": {"healthy_cards": [0, 1, 2, 3]}, "compute": {"healthy_cards": [0, 2, 3]},
             "interconnect": {}}
    assert healthy_cards(facts) == [0, 2, 3]
    assert healthy_cards({"device": {"device": "cpu"}}) is None
