"""Volume scaling: the same items on 4 Ray workers and on one in-process runner.

Each item's handler waits DELAY_MS (standing in for device time). Both paths record every
item through the runner's ledger (the Ray path with the driver's first-wins insert), in this
one invocation:

- single: the in-process pilot loop (one handler, batch after batch);
- ray: the volume driver on a local Ray with 4 CPU workers (one actor each).

Scaling efficiency = ray items/s / (4 x single items/s), target >= 0.85. Throughput is
measured from the first batch handed out to the last item recorded; Ray's start (cluster
and actors, paid once per volume) is printed beside it. Then the per-item overhead of each
path with a 0 ms handler (items/s of both). The last line is the verdict.
Usage: .venv/bin/python bench/volume.py [ITEMS] [DELAY_MS]; PREFLIGHT_BENCH_SMOKE=1: 100 items of
1 ms (a smoke run that checks the bench runs to its verdict line, not the target).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.inputs import list_dir  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.spec import RunSpec  # noqa: E402
from runner.stage import StageContext  # noqa: E402
from runner.stages.pilot import Recorder  # noqa: E402

WORKERS = 4
TARGET = 0.85
BATCH = 25
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
HANDLER = '''
import time

def handle(items, ctx):
    delay = float(ctx.params.get("delay_s", 0))
    out = []
    for it in items:
        if delay:
            time.sleep(delay)
        out.append({"id": it.id, "status": "accepted", "category": "x"})
    return out
'''


def make_spec(root: Path, count: int, delay_s: float) -> RunSpec:
    inputs = root / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (inputs / f"i{i:06d}.txt").write_text("x")
    (root / "benchwork.py").write_text(HANDLER)
    return RunSpec.from_dict({
        "run_id": "bench", "name": "bench", "project": {"dir": str(root)},
        "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": count},
        "task": {"handler": "benchwork:handle", "categories": ["x"], "batch_size": BATCH,
                 "params": {"delay_s": delay_s}},
        "volume": {"workers": WORKERS, "batch_size": BATCH}})


def context(spec: RunSpec, run_dir: Path) -> tuple[StageContext, Recorder, Ledger, list[Any]]:
    run_dir.mkdir(parents=True)
    ctx = StageContext(spec=spec, run_dir=str(run_dir))
    items = list_dir(spec.inputs.dir, spec.inputs.pattern)
    ledger = Ledger.open(str(run_dir / "ledger.sqlite"), new_attempt=True)
    return ctx, Recorder(ctx, ledger, items, set()), ledger, items


def single(spec: RunSpec, run_dir: Path) -> float:
    """Items/s of the in-process loop: one handler, batch after batch."""
    from runner.workloads import load_handler, make_context

    ctx, recorder, ledger, items = context(spec, run_dir)
    handler = load_handler(spec)
    wctx = make_context(spec, recorder.outputs_dir)
    t0 = time.perf_counter()
    for start in range(0, len(items), BATCH):
        batch = items[start:start + BATCH]
        recorder.record([it.id for it in batch], handler(batch, wctx))
    rate = len(items) / (time.perf_counter() - t0)
    assert ledger.count() == len(items)
    ledger.close()
    return rate


def on_ray(ray: Any, spec: RunSpec, run_dir: Path) -> tuple[float, float]:
    """(items/s of the driver on WORKERS actors, seconds to start the actors)."""
    from runner.volume_driver import Driver
    from runner.volume_queue import Batch
    from runner.volume_workers import start_workers, worker_factory

    ctx, recorder, ledger, items = context(spec, run_dir)
    t0 = time.perf_counter()
    workers = start_workers(ctx, ray, spec.volume, WORKERS,
                            worker_factory(ctx, ray, spec.volume))
    started = time.perf_counter() - t0
    batches = [Batch(n, items[i:i + BATCH]) for n, i in enumerate(range(0, len(items), BATCH))]
    t1 = time.perf_counter()
    Driver(ctx, recorder, ray, workers, batches, 0.0).run()
    rate = len(items) / (time.perf_counter() - t1)
    assert ledger.count() == len(items) and ledger.re_executed() == 0
    ledger.close()
    for w in workers:
        ray.kill(w.actor)
    return rate, started


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else (100 if SMOKE else 10_000)
    delay_ms = float(sys.argv[2]) if len(sys.argv) > 2 else (1.0 if SMOKE else 20.0)
    from runner import volume_ray

    with tempfile.TemporaryDirectory(prefix="bench-volume-") as tmp:
        root = Path(tmp)
        slow = make_spec(root / "slow", count, delay_ms / 1000)
        fast = make_spec(root / "fast", count, 0.0)
        assert slow.volume is not None
        volume_ray.prepare_env(slow.volume)
        ray = volume_ray.import_ray()
        t0 = time.perf_counter()
        volume_ray.start(ray, slow.volume, str(root), WORKERS)
        ray_start = time.perf_counter() - t0
        try:
            one = single(slow, root / "run-single")
            many, actors_s = on_ray(ray, slow, root / "run-ray")
            one0 = single(fast, root / "run-single-0")
            many0, _ = on_ray(ray, fast, root / "run-ray-0")
        finally:
            volume_ray.stop(ray, [], str(root))
    eff = many / (WORKERS * one)
    print(f"items: {count}, handler wait: {delay_ms:g} ms per item, batch {BATCH}, "
          f"{os.cpu_count()} CPU(s), ray {ray.__version__}")
    print(f"ray start: {ray_start:.1f} s (local cluster), {actors_s:.1f} s ({WORKERS} actors)")
    print(f"single in-process runner: {one:.1f} items/s")
    print(f"ray, {WORKERS} workers: {many:.1f} items/s")
    print(f"0 ms handler: in-process {one0:.0f} items/s, ray {many0:.0f} items/s "
          f"(per-item overhead: {1e6 / one0:.0f} us vs {1e6 / many0:.0f} us)")
    verdict = "PASS" if eff >= TARGET else "MISS"
    print(f"scaling_efficiency: {eff:.3f} (target >= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
