"""What a failing input costs the volume (issue 34, point 4), counted in executions.

bench/bisection.py at a small size: the driver, its queue and the ledger real, Ray a fake
that runs each batch with the worker's own handler call; and the driver against the fake
Ray of test_volume_driver.py, whose batches a real generator handler runs, with an input
that hangs (interrupted by the item clock), one that raises and one that kills its worker.
"""

from __future__ import annotations

import collections
import importlib.util
import sys
from pathlib import Path
from typing import Any, Iterator

from runner.handler_call import BatchCall
from runner.inputs import Item
from runner.itemtimeout import ItemTimedOut
from tests.runner.test_volume_driver import FakeRay, Ref, _driver, _every_id_once

BENCH = Path(__file__).resolve().parents[2] / "bench" / "bisection.py"


def _bench() -> Any:
    spec = importlib.util.spec_from_file_location("bench_bisection", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_bisection"] = module
    spec.loader.exec_module(module)
    return module


def test_one_percent_bad_inputs_cost_a_generator_handler_at_most_1_2_executions(
        tmp_path: Path) -> None:
    """Halving redid the good part of every failed batch (1.55x executions for a handler
    that stops at its bad input, about 2x for one that takes its whole batch first). Now
    a generator's yielded results are kept and its suspect tried alone: about 1.01x; a
    list-returning loop re-runs what it did before the raise; a whole-batch handler gets
    quarters. The bench also checks every id once and each bad input refused."""
    bench = _bench()
    got = {(shape, keep): bench.simulate(shape, 1000, 64, keep, tmp_path)["executions"]
           for shape in ("generator", "loop", "whole") for keep in (False, True)}
    assert got["generator", True] <= 1.05 < 1.2 < got["generator", False]
    assert got["loop", True] < got["loop", False]
    assert got["whole", True] < got["whole", False]


class HandlerRay(FakeRay):
    """The fake Ray of test_volume_driver.py, its batches run by a real handler call."""

    def __init__(self, workers: int, handler: Any, **faults: Any) -> None:
        super().__init__(workers, **faults)
        self.handler = handler

    def get(self, ref: Ref) -> dict[str, Any]:
        ids = [p[0] for p in ref.payload or []]
        actor = ref.actor
        if ref.payload is None or actor.dead or self.kills & set(ids) or actor.key in self.dies:
            return super().get(ref)
        ref.done = True  # type: ignore[attr-defined]
        call = BatchCall(self.handler, [Item(str(i), str(p), int(s))
                                        for i, p, s in ref.payload], None)
        try:
            return {"results": call(), "seconds": 0.01}
        except ItemTimedOut:  # as the worker's item clock interrupts a hung input
            return {"error": "no result within task.item_timeout_s = 1 s per item",
                    "cause": "timeout", **call.partial()}
        except Exception as exc:
            return {"error": f"task.handler raised {type(exc).__name__}: {exc}",
                    "cause": "raised", **call.partial()}


def test_a_hang_a_raise_and_a_crash_are_still_refused_alone_and_nothing_else_runs_twice(
        tmp_path: Path) -> None:
    ran: collections.Counter[str] = collections.Counter()

    def handle(items: list[Item], ctx: Any) -> Iterator[dict[str, Any]]:
        for item in items:
            ran[item.id] += 1
            if item.id == "i013":
                raise ItemTimedOut()
            if item.id == "i027":
                raise ValueError("bad input i027")
            yield {"id": item.id, "status": "accepted", "category": "x"}

    ray = HandlerRay(3, handle, kills={"i045"})
    driver, ledger, events = _driver(tmp_path, ray, 60, size=10, in_flight=2)
    facts = driver.run()
    rows = _every_id_once(ledger, 60)
    refused = {i: r.reason for i, r in rows.items() if r.status == "refused"}
    assert refused == {
        "i013": "timeout: no result within task.item_timeout_s = 0 s (the handler was "
                "interrupted on its worker)",
        "i027": "task.handler raised ValueError: bad input i027",
        "i045": "its worker died 2 times while running it alone: ActorDiedError: the actor "
                f"w{refused_worker(events)} died"}
    assert facts["refused_alone"] == 3
    # the hang and the raise: the results yielded before them kept, their suspect alone
    splits = {d["batch"]: d for e, d in events if e == "volume.split"}
    named = sorted((d["suspect"], d["kept"]) for d in splits.values()
                   if "suspect" in d and d["parts"])
    assert named == [("i013", 3), ("i027", 7)]
    # executions: every good input once, but those of the crash's batch (no reply, no
    # hint: split in quarters), the hang and the raise twice (their batch, then alone)
    crashed = {f"i{n:03d}" for n in range(40, 50)}
    assert {i for i, n in ran.items() if n != 1} - crashed == {"i013", "i027"}
    assert ran["i013"] == ran["i027"] == 2


def refused_worker(events: list[Any]) -> str:
    """The worker that died the second time under the crashing input alone."""
    died = [d["worker"] for e, d in events if e == "volume.split" and d["cause"] == "died"
            and d["refused"]]
    return died[-1].split("@")[0][1:]
