"""What the runner's supervision costs a fast handler: the in-process pilot against a bare
loop, in the same invocation.

The pilot (``runner.stages.pilot.pilot``, run in this process's main thread as the
watchdog's worker runs it) goes over N inputs (default 5,000) with a handler that takes
1 ms per item (a sleep: the CPU stays free, as while a device computes), with everything
on: the per-item timeout clock (``task.item_timeout_s``), the ledger (one transaction per
batch), the audit, ``item.done`` and ``progress`` events appended to events.jsonl. The
baseline is a bare loop that calls the same handler on the same batches and writes the
same results to a plain SQLite table (WAL, one transaction per batch). Best of ROUNDS,
alternating. Target: overhead at most 3 %. PREFLIGHT_BENCH_SMOKE=1: 200 items, one round (a
smoke run that checks the bench runs to its verdict line, not the target).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runner.events import EventWriter  # noqa: E402
from runner.inputs import list_inputs  # noqa: E402
from runner.spec import RunSpec  # noqa: E402
from runner.stage import StageContext  # noqa: E402
from runner.stages.pilot import pilot  # noqa: E402

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
ROUNDS = 1 if SMOKE else 4
BATCH = 8
TARGET = 0.03
HANDLER = '''
import time

def handle(items, ctx):
    out = []
    for item in items:
        time.sleep(0.001)  # 1 ms per item, waiting like a handler waits on its device
        out.append({"id": item.id, "status": "accepted", "category": "x"})
    return out
'''


def make_spec(root: Path, n: int) -> RunSpec:
    inputs = root / "in"
    inputs.mkdir()
    for k in range(n):
        (inputs / f"item-{k:05d}.txt").write_text("x")
    (root / "bench_supervised.py").write_text(HANDLER)
    sys.path.insert(0, str(root))
    return RunSpec.from_dict({
        "run_id": "bench-supervision", "name": "bench", "project": {"dir": str(root)},
        "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": n},
        "task": {"handler": "bench_supervised:handle", "categories": ["x"],
                 "batch_size": BATCH, "item_timeout_s": 30}})


def supervised(spec: RunSpec, run_dir: Path) -> float:
    run_dir.mkdir()
    writer = EventWriter(str(run_dir / "events.jsonl"), spec.run_id)
    ctx = StageContext(spec=spec, run_dir=str(run_dir),
                       emit=lambda t, **d: writer.emit(t, **d) and None)
    t0 = time.perf_counter()
    facts = pilot(ctx)
    elapsed = time.perf_counter() - t0
    writer.close()
    assert facts["done"] == spec.inputs.expected_count and "item_timeout" not in facts, facts
    return elapsed


def bare(spec: RunSpec, db_path: Path) -> float:
    import bench_supervised  # type: ignore[import-not-found]

    conn = sqlite3.connect(str(db_path), isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("CREATE TABLE items (id TEXT PRIMARY KEY, status TEXT, category TEXT)")
    t0 = time.perf_counter()
    items = list_inputs(spec)
    for start in range(0, len(items), BATCH):
        results = bench_supervised.handle(items[start:start + BATCH], None)
        conn.execute("BEGIN IMMEDIATE")
        conn.executemany("INSERT INTO items VALUES (?, ?, ?)",
                         [(r["id"], r["status"], r["category"]) for r in results])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else (200 if SMOKE else 5000)
    t_bare, t_pilot = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        spec = make_spec(root, n)
        for r in range(ROUNDS):
            t_bare.append(bare(spec, root / f"bare-{r}.sqlite"))
            t_pilot.append(supervised(spec, root / f"run-{r}"))
        events = sum(1 for _ in open(root / "run-0" / "events.jsonl", encoding="utf-8"))
    best_bare, best_pilot = min(t_bare), min(t_pilot)
    overhead = best_pilot / best_bare - 1
    print(f"bare loop: {n} items in {best_bare:.3f} s (runs: "
          f"{', '.join(f'{t:.3f}' for t in t_bare)})")
    print(f"supervised pilot (item clock, ledger, audit, {events} events): {best_pilot:.3f} s "
          f"(runs: {', '.join(f'{t:.3f}' for t in t_pilot)}); "
          f"{1e6 * (best_pilot - best_bare) / n:.0f} µs per item")
    print(f"supervision_overhead: {100 * overhead:.1f}% (target <= {100 * TARGET:.0f}%) "
          f"{'PASS' if overhead <= TARGET else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
