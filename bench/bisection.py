"""What a failing input costs: handler executions per input with 1 % bad inputs.

The volume's driver (``runner.volume_driver.Driver``), its queue and the ledger are real; Ray is
replaced by an in-process fake that runs each batch at once with the worker's own call of
the handler (``runner.handler_call.BatchCall``, the reply ``_Worker.run`` builds). Every
handler counts the items it works on: an item it takes from its batch is one execution
(a handler that stops at a raise did not work on the items after it). Three handler
shapes, each under the rule before issue 34 (a failed batch halved, its results lost) and
under today's (a generator's yielded results kept, the suspect tried alone, the rest of
the batch run again: those before it and those after it, a batch each; a batch that says
nothing of its bad input in quarters):

- ``generator``: ``for item in items: ... yield result``;
- ``loop``: the same loop appending to a list it returns;
- ``whole``: takes the whole batch first (``list(items)``, as a GPU batch is built), then
  fails for its bad input.

Every id is checked once in the ledger, each bad one refused with the handler's error.
The verdict is the generator handler's executions per input, target <= 1.2.
Usage: .venv/bin/python bench/bisection.py [INPUTS] [BATCH]; PREFLIGHT_BENCH_SMOKE=1:
1,000 inputs.
"""

from __future__ import annotations

import collections
import os
import random
import sys
import tempfile
import time
import types
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner import volume_queue  # noqa: E402
from runner.handler_call import BatchCall  # noqa: E402
from runner.inputs import Item  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.spec import RunSpec  # noqa: E402
from runner.stage import StageContext  # noqa: E402
from runner.stages.pilot import Recorder  # noqa: E402
from runner.volume_driver import Driver  # noqa: E402
from runner.volume_queue import Batch  # noqa: E402
from runner.volume_workers import Worker  # noqa: E402

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
TARGET = 1.2
BAD_SHARE = 0.01
WORKERS = 4
PARTS = volume_queue.SPLIT_PARTS


def handlers(bad: set[str], count: collections.Counter[str]) -> Dict[str, Callable[..., Any]]:
    def result(item: Item) -> Dict[str, Any]:
        count[item.id] += 1
        if item.id in bad:
            raise ValueError(f"bad input {item.id}")
        return {"id": item.id, "status": "accepted", "category": "x"}

    def generator(items: List[Item], ctx: Any) -> Iterator[Dict[str, Any]]:
        for item in items:
            yield result(item)

    def loop(items: List[Item], ctx: Any) -> List[Dict[str, Any]]:
        return [result(item) for item in items]

    def whole(items: List[Item], ctx: Any) -> List[Dict[str, Any]]:
        batch = list(items)
        count.update(it.id for it in batch)
        for item in batch:
            if item.id in bad:
                raise ValueError(f"bad input {item.id}")
        return [{"id": it.id, "status": "accepted", "category": "x"} for it in batch]

    return {"generator": generator, "loop": loop, "whole": whole}


class Ref:
    def __init__(self, actor: Actor, payload: List[List[Any]]) -> None:
        self.actor, self.payload = actor, payload


class Actor:
    """A worker: ``run.remote(payload)`` is run when the driver gets its result."""

    def __init__(self, key: int, handler: Callable[..., Any], root: str, keep: bool) -> None:
        self.key, self.handler, self.root, self.keep = key, handler, root, keep
        actor = self

        class Run:
            def remote(self, payload: List[List[Any]], *ahead: Any) -> Ref:
                return Ref(actor, payload)

        self.run = Run()

    def reply(self, payload: List[List[Any]]) -> Dict[str, Any]:
        items = [Item(str(i), os.path.join(self.root, str(p)), int(s)) for i, p, s in payload]
        call = BatchCall(self.handler, items, None)
        try:
            return {"results": call(), "seconds": 0.0}
        except Exception as exc:
            partial = call.partial() if self.keep else {}  # before issue 34: nothing kept
            return {"error": f"task.handler raised {type(exc).__name__}: {exc}",
                    "cause": "raised", **partial}


class FakeRay:
    exceptions = types.SimpleNamespace()

    def wait(self, refs: List[Ref], num_returns: int, timeout: float) -> tuple[list, list]:
        return refs[:num_returns], refs[num_returns:]

    def get(self, ref: Ref) -> Dict[str, Any]:
        return ref.actor.reply(ref.payload)

    def kill(self, actor: Any, no_restart: bool = True) -> None:
        pass

    def nodes(self) -> List[Dict[str, Any]]:
        return [{"NodeID": "node", "Alive": True}]


def simulate(shape: str, inputs: int, batch: int, keep: bool, root: Path) -> Dict[str, Any]:
    """One volume of ``inputs`` with 1 % bad ones; executions per input and the checks."""
    ids = [f"i{n:06d}" for n in range(inputs)]
    bad = set(random.Random(34).sample(ids, max(1, int(inputs * BAD_SHARE))))
    count: collections.Counter[str] = collections.Counter()
    handler = handlers(bad, count)[shape]
    run_dir = root / f"{shape}-{'kept' if keep else 'halves'}"
    run_dir.mkdir(parents=True)
    spec = RunSpec.from_dict({"run_id": "bench", "name": "bench",
                              "inputs": {"dir": str(run_dir)}, "task": {"categories": ["x"]}})
    events: List[Any] = []
    ctx = StageContext(spec=spec, run_dir=str(run_dir),
                       emit=lambda etype, **data: events.append((etype, data)))
    items = [Item(i, str(run_dir / i), 1) for i in ids]
    ledger = Ledger.open(str(run_dir / "ledger.sqlite"), new_attempt=True)
    ray = FakeRay()
    workers = [Worker(k, Actor(k, handler, str(run_dir), keep), node="node", host="h")
               for k in range(WORKERS)]
    batches = [Batch(n, items[i:i + batch]) for n, i in enumerate(range(0, inputs, batch))]
    volume_queue.SPLIT_PARTS = PARTS if keep else 2  # before issue 34: halves
    t0 = time.perf_counter()
    facts = Driver(ctx, Recorder(ctx, ledger, items, set()), ray, workers, batches, 0.0,
                   in_flight=2).run()
    seconds = time.perf_counter() - t0
    rows = {r.id: r for r in ledger.rows()}
    ledger.close()
    assert sorted(rows) == ids, "every id once in the ledger"
    refused = {i for i, r in rows.items() if r.status == "refused"}
    assert refused == bad, f"refused {len(refused)}, bad {len(bad)}"
    assert all(f"bad input {i}" in (rows[i].reason or "") for i in bad)
    return {"executions": sum(count.values()) / inputs, "splits": facts["batches_split"],
            "seconds": seconds}


def main() -> int:
    inputs = int(sys.argv[1]) if len(sys.argv) > 1 else (1_000 if SMOKE else 20_000)
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 64
    print(f"inputs: {inputs}, bad: {BAD_SHARE:.0%}, batch {batch}, {WORKERS} workers "
          "(fake Ray; the driver, queue, ledger and the worker's handler call real)")
    figures: Dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="bench-bisection-") as tmp:
        for shape in ("generator", "loop", "whole"):
            before = simulate(shape, inputs, batch, False, Path(tmp))
            after = simulate(shape, inputs, batch, True, Path(tmp))
            figures[shape] = after["executions"]
            print(f"{shape:>9}: {before['executions']:.3f}x executions halving "
                  f"({before['splits']} splits) -> {after['executions']:.3f}x now "
                  f"({after['splits']} splits)")
    value = figures["generator"]
    verdict = "PASS" if value <= TARGET else "MISS"
    print(f"bisection_executions_generator: {value:.3f} (target <= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
