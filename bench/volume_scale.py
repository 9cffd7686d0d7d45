"""The volume's driver at the shape users rent: 100,000 inputs on a simulated 4 x 8 cluster.

What is real: the volume's driver (runner.volume_driver.Driver: hand-out with batches in flight,
ray.wait, the first-wins ledger insert, the item events through the runner's EventWriter,
progress), Ray (a local Ray started by runner.volume_ray.start), and one Ray actor per
worker (runner.volume_ray's _Worker, the handler loaded once, run batch after batch).
What is simulated: the cluster and its cards. This machine is one Ray node that offers
NODES x CARDS fake cards (Ray's ``num_gpus`` resource; no GPU is touched), so the 32
workers are 32 actor processes on this one machine, not on 4 machines; each handler's
device time is a sleep of DELAY_MS per item; like a real handler it returns a small JSON
output per input (about 70 bytes), which each worker writes into one shard per batch on
its node (``runner.outputs.ShardWriter``, one fsync a batch) before the driver records the
ids, statuses and where each output lies. The inputs are ids with paths that the handler
never opens (listing and reading files is not what this measures).

Three figures, all measured in this invocation, on the same run:

- the workers' combined handler rate: each reply's measured handler seconds, summed, give
  the items/s one worker's handler does when it is never idle; times the workers. The
  same handler run alone in this process is printed beside it (no contention);
- the driver's items/s: every item recorded, from the first batch handed out to the last
  result recorded;
- the driver's recording rate: items recorded (ledger rows with their output references,
  item events) per second its recording thread was busy (``Driver.recording_s``): what
  one driver could record if the workers were faster still.

Target: driver items/s >= 0.9 x the combined handler rate (the driver keeps the cards
busy), the driver process's peak RSS (ru_maxrss) < 1 GB, and the recording >= 20,000
items/s; the verdict covers all three. Ray's start and the actors' start are printed apart
(paid once per volume). The last line is the verdict.
Usage: .venv/bin/python bench/volume_scale.py [ITEMS] [DELAY_MS];
PREFLIGHT_BENCH_SMOKE=1: 2,000 inputs on 2 x 2 simulated cards (a smoke run that checks the
bench runs to its verdict line, not the target).
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, List, Optional, Tuple

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.events import EventWriter  # noqa: E402
from runner.inputs import Item  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.spec import RunSpec  # noqa: E402
from runner.stage import StageContext  # noqa: E402
from runner.stages.pilot import Recorder  # noqa: E402

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
NODES = 2 if SMOKE else 4
CARDS = 2 if SMOKE else 8
BATCH = 64
IN_FLIGHT = 2
TARGET = 0.90
RSS_LIMIT_MB = 1024
RECORD_TARGET = 20_000  # items/s the driver's recording thread keeps up with
HANDLER = '''
import time

def handle(items, ctx):
    delay = float(ctx.params["delay_s"])
    out = []
    for it in items:
        time.sleep(delay)                    # stands in for the card's time
        out.append({"id": it.id, "status": "accepted", "category": "x",
                    "output": {"id": it.id, "label": "x", "score": 0.5,
                               "tokens": len(it.id)}})
    return out
'''


class Timed(Recorder):
    """The runner's Recorder, also summing what the workers said their handler took."""

    handler_s = 0.0
    handled = 0
    cpu_s = 0.0  # the recording thread's CPU seconds in these calls (time.thread_time)

    def record_first_wins(self, asked: Any, results: Any,
                          elapsed_s: Optional[float] = None) -> Tuple[int, int]:
        if elapsed_s is not None:
            self.handler_s += float(elapsed_s)
            self.handled += len(results) if isinstance(results, list) else 0
        t0 = time.thread_time()
        try:
            return super().record_first_wins(asked, results, elapsed_s=elapsed_s)
        finally:
            self.cpu_s += time.thread_time() - t0


def make_spec(root: Path, count: int, delay_s: float) -> RunSpec:
    (root / "inputs").mkdir(parents=True)
    (root / "benchwork.py").write_text(HANDLER)
    return RunSpec.from_dict({
        "run_id": "bench-scale", "name": "bench-scale", "backend": "cuda",
        "project": {"dir": str(root)},
        "inputs": {"dir": str(root / "inputs"), "pattern": "*.txt", "expected_count": count},
        "task": {"handler": "benchwork:handle", "categories": ["x"], "batch_size": BATCH,
                 "params": {"delay_s": delay_s}, "torch_threads": 1},
        "volume": {"gpus": True, "cards": list(range(NODES * CARDS)), "cards_per_worker": 1,
                   "batch_size": BATCH, "in_flight": IN_FLIGHT}})


def alone(spec: RunSpec, items: List[Item]) -> float:
    """Items/s of the handler called in this process, nothing else running."""
    from runner.workloads import load_handler, make_context

    handler = load_handler(spec)
    wctx = make_context(spec, tempfile.mkdtemp(prefix="bench-scale-out-"))
    sample = items[:4 * BATCH]
    t0 = time.perf_counter()
    for start in range(0, len(sample), BATCH):
        handler(sample[start:start + BATCH], wctx)
    return len(sample) / (time.perf_counter() - t0)


def drive(ray: Any, spec: RunSpec, items: List[Item],
          run_dir: Path) -> Tuple[float, float, Timed, dict[str, Any]]:
    """(driver items/s, actors' start s, the recorder, the driver's facts with its
    recording thread's busy seconds unrounded)."""
    from runner.outputs import read_output
    from runner.volume_driver import Driver
    from runner.volume_queue import Batch
    from runner.volume_workers import start_workers, worker_factory

    run_dir.mkdir(parents=True)
    writer = EventWriter(str(run_dir / "events.jsonl"), spec.run_id)
    ctx = StageContext(spec=spec, run_dir=str(run_dir),
                       emit=lambda t, **d: writer.emit(t, **d) and None)
    ledger = Ledger.open(str(run_dir / "ledger.sqlite"), new_attempt=True)
    recorder = Timed(ctx, ledger, items, set())
    vspec = spec.volume
    assert vspec is not None
    t0 = time.perf_counter()
    workers = start_workers(ctx, ray, vspec, 0, worker_factory(ctx, ray, vspec))
    started = time.perf_counter() - t0
    assert len(workers) == NODES * CARDS, len(workers)
    batches = [Batch(n, items[i:i + BATCH]) for n, i in enumerate(range(0, len(items), BATCH))]
    t1 = time.perf_counter()
    driver = Driver(ctx, recorder, ray, workers, batches, 0.0, in_flight=IN_FLIGHT)
    facts = driver.run()
    rate = len(items) / (time.perf_counter() - t1)
    facts["recording_s"] = driver.recording_s
    assert ledger.count() == len(items) and ledger.re_executed() == 0
    refs = {row.id: row.output for row in ledger.rows()}
    assert all(refs.values()), "an accepted input without its output"
    for iid in list(refs)[::max(1, len(refs) // 50)]:  # found again by id, in its shard
        assert read_output(str(run_dir), str(refs[iid]), iid)["id"] == iid
    ledger.close()
    writer.close()
    for w in workers:
        ray.kill(w.actor)
    return rate, started, recorder, facts


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else (2_000 if SMOKE else 100_000)
    delay_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 2.0
    from runner import volume_ray

    workers = NODES * CARDS
    with tempfile.TemporaryDirectory(prefix="bench-scale-") as tmp:
        root = Path(tmp)
        spec = make_spec(root, count, delay_ms / 1000)
        assert spec.volume is not None
        items = [Item(f"doc-{i:07d}", str(root / "inputs" / f"doc-{i:07d}.txt"), 1)
                 for i in range(count)]
        one = alone(spec, items)
        volume_ray.prepare_env(spec.volume)
        ray = volume_ray.import_ray()
        t0 = time.perf_counter()
        volume_ray.start(ray, spec.volume, str(root), 1)
        ray_start = time.perf_counter() - t0
        try:
            rate, actors_s, rec, facts = drive(ray, spec, items, root / "run")
        finally:
            volume_ray.stop(ray, [], str(root))
    per_worker = rec.handled / rec.handler_s if rec.handler_s else 0.0
    combined = workers * per_worker
    ratio = rate / combined if combined else 0.0
    rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    recording = count / facts["recording_s"] if facts["recording_s"] else float("inf")
    print(f"simulated: {NODES} nodes x {CARDS} cards = {workers} workers as {workers} Ray actors "
          f"on this one machine (one local Ray node offering {workers} fake cards: Ray's "
          f"num_gpus, no GPU touched); device time a {delay_ms:g} ms sleep per item")
    print(f"real: the volume driver, the ledger, the events file, Ray, the actors; "
          f"{os.cpu_count()} CPU(s) here, ray {ray.__version__}")
    print(f"items: {count}, batch {BATCH}, {IN_FLIGHT} in flight per worker; a JSON output "
          "per input, one shard per batch written by its worker")
    print(f"ray start: {ray_start:.1f} s, {workers} actors started in {actors_s:.1f} s")
    print(f"handler alone in this process: {one:.1f} items/s (x {workers} = "
          f"{one * workers:.0f} items/s without contention)")
    print(f"workers' handler rate, from their replies: {per_worker:.1f} items/s each, "
          f"combined {combined:.0f} items/s")
    print(f"driver: {rate:.0f} items/s recorded ({facts['re_executed']} re-executed, "
          f"{facts['batches_requeued']} re-queued); peak RSS {rss_mb:.0f} MB "
          f"(limit {RSS_LIMIT_MB} MB)")
    print(f"driver's recording thread: busy {facts['recording_s']:.2f} s for {count} items "
          f"(ledger rows with output references, item events): {recording:.0f} items/s "
          f"(target >= {RECORD_TARGET}); of it {rec.cpu_s:.2f} s on a CPU, "
          f"{count / rec.cpu_s if rec.cpu_s else 0:.0f} items/s a CPU second (the rest: "
          f"waiting for the disk or for a CPU the {workers} actors share here)")
    ok = ratio >= TARGET and rss_mb < RSS_LIMIT_MB and recording >= RECORD_TARGET
    print(f"driver_vs_handler_rate: {ratio:.3f} (target >= {TARGET:.2f}, peak RSS "
          f"{rss_mb:.0f} MB < {RSS_LIMIT_MB} MB, recording {recording:.0f} items/s >= "
          f"{RECORD_TARGET}) {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
