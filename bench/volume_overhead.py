"""What a volume costs over plain loops: a handler with a warm-up and a JSON output per input.

The same handler in both, in this one invocation: a warm-up at its first call in each
process (WARMUP_S: loading a model, a card's first kernels), then per batch a sleep with a
fixed part and a per-item part (standing in for a card's time), and one small JSON output
per input (about 70 bytes):

- plain: as many plain processes as the volume has workers, each looping over its share
  of the inputs batch after batch and writing each output to a plain file (open, write,
  close: no fsync, no ledger, no events): what a team would write by hand;
- volume: the volume's driver (``runner.volume_driver.Driver``, called as ``run_volume`` calls it:
  batches in flight, read ahead and the item clock as the spec sets them) on a local Ray
  with the embedded default's workers (one per core, at most 4), the real worker actors
  (each batch's outputs in one shard on the worker's node, one fsync), the ledger and the
  events file.

The warm-up is paid the same way by both sides: once per process, inside the timed span,
by the handler's own first call. Each plain process is started, given its share and waits
for "go" with its handler imported but never called; each actor is started with its
handler loaded (``start_workers``: the module imported, never called) before the first
batch is handed out. So every process, plain or actor, pays WARMUP_S on its first batch,
after the clock started and in parallel with its peers; neither side warms up before it.

Throughput: plain, from the first process's start to the last one's end (interpreters and
handlers loaded before); volume, from the first batch handed out to the last item recorded
(Ray's start and the actors', paid once per volume, printed beside). Two interleaved
rounds (plain, volume, plain, volume; Ray up for both, fresh actors and processes each
round, so each pays its warm-up again), the best of each side: the shared machine's load
moves between runs. Ratio = volume ÷ plain, target >= 0.95 on the shared 2-core build
machine. Also printed: how long the driver's recording thread was busy (what the hand-out
loop no longer waits for).
Usage: .venv/bin/python bench/volume_overhead.py [ITEMS]; PREFLIGHT_BENCH_SMOKE=1: 400
inputs in batches of 16, one round (checks that the bench runs to its verdict line, not
the target).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.events import EventWriter  # noqa: E402
from runner.inputs import list_dir  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.spec import RunSpec  # noqa: E402
from runner.stage import StageContext  # noqa: E402
from runner.stages.pilot import Recorder  # noqa: E402

TARGET = 0.95
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
BATCH = 16 if SMOKE else 64
ROUNDS = 1 if SMOKE else 2  # plain, volume, plain, volume: the best of each
FIXED_S, PER_ITEM_S = 0.010, 0.0005  # a batch of 64: 42 ms, about 1,500 items/s a worker
WARMUP_S = 0.2 if SMOKE else 1.0  # the handler's first call in each process
PARAMS = {"fixed_s": FIXED_S, "per_item_s": PER_ITEM_S, "warmup_s": WARMUP_S}
HANDLER = '''
import time

_warm = False

def handle(items, ctx):
    global _warm
    if not _warm:  # the first call in this process: a model loaded, a card's first kernels
        time.sleep(ctx.params["warmup_s"])
        _warm = True
    time.sleep(ctx.params["fixed_s"] + ctx.params["per_item_s"] * len(items))
    return [{"id": it.id, "status": "accepted", "category": "x",
             "output": {"id": it.id, "label": "x", "score": 0.5, "tokens": len(it.id)}}
            for it in items]
'''
# One plain loop: the handler over its share, a plain file per output.
PLAIN = '''
import json, os, sys, time
sys.path.insert(0, sys.argv[1])
from benchwork import handle
class Ctx:
    params = json.loads(sys.argv[2])
class It:
    def __init__(self, path):
        self.path, self.id = path, os.path.basename(path)[:-4]
paths, out, batch = json.loads(sys.stdin.readline()), sys.argv[3], int(sys.argv[4])
items = [It(p) for p in paths]
print("ready", flush=True)
sys.stdin.readline()  # every loop starts at once
t0 = time.time()
for start in range(0, len(items), batch):
    for res in handle(items[start:start + batch], Ctx):
        with open(os.path.join(out, res["id"] + ".json"), "w") as fh:
            fh.write(json.dumps(res["output"], sort_keys=True))
print(json.dumps([t0, time.time()]))
'''


def make_spec(root: Path, count: int) -> RunSpec:
    inputs = root / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (inputs / f"i{i:06d}.txt").write_text("x")
    (root / "benchwork.py").write_text(HANDLER)
    return RunSpec.from_dict({
        "run_id": "bench", "name": "bench", "project": {"dir": str(root)},
        "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": count},
        "task": {"handler": "benchwork:handle", "categories": ["x"], "batch_size": BATCH,
                 "params": PARAMS},
        "volume": {"batch_size": BATCH}})  # the embedded default otherwise: CPU workers


def plain(spec: RunSpec, root: Path, workers: int, out: Path) -> float:
    """Items/s of ``workers`` plain processes, each over its share, writing into ``out``."""
    items = list_dir(spec.inputs.dir, spec.inputs.pattern)
    out.mkdir()
    script = root / "plain.py"
    script.write_text(PLAIN)
    params = json.dumps(PARAMS)
    procs = []
    for k in range(workers):
        proc = subprocess.Popen([sys.executable, str(script), str(root), params, str(out),
                                 str(BATCH)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(json.dumps([it.path for it in items[k::workers]]) + "\n")
        proc.stdin.flush()
        procs.append(proc)
    for proc in procs:  # each loaded, its share read: then all go at once
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.close()
    spans = []
    for proc in procs:
        assert proc.stdout is not None
        last = proc.stdout.read().strip().splitlines()[-1]
        assert proc.wait() == 0
        spans.append(json.loads(last))
    assert len(os.listdir(out)) == len(items)
    return len(items) / (max(e for _s, e in spans) - min(s for s, _e in spans))


def on_ray(ray: Any, spec: RunSpec, run_dir: Path, workers: int) -> dict[str, float]:
    """The volume's driver over ``workers`` actors: items/s, actor start, recording."""
    from runner.itemtimeout import item_timeout, pilot_item_s
    from runner.volume_driver import Driver
    from runner.volume_queue import Batch
    from runner.volume_workers import start_workers, worker_factory

    run_dir.mkdir(parents=True)
    vspec = spec.volume
    assert vspec is not None
    writer = EventWriter(str(run_dir / "events.jsonl"), spec.run_id)
    ctx = StageContext(spec=spec, run_dir=str(run_dir),
                       emit=lambda t, **d: writer.emit(t, **d) and None)
    items = list_dir(spec.inputs.dir, spec.inputs.pattern)
    ledger = Ledger.open(str(run_dir / "ledger.sqlite"), new_attempt=True)
    recorder = Recorder(ctx, ledger, items, set())
    t0 = time.perf_counter()
    spawn = worker_factory(ctx, ray, vspec)
    actors = start_workers(ctx, ray, vspec, workers, spawn)
    started = time.perf_counter() - t0
    batches = [Batch(n, items[i:i + BATCH]) for n, i in enumerate(range(0, len(items), BATCH))]
    driver = Driver(ctx, recorder, ray, actors, batches, float(vspec.batch_timeout_s or 0),
                    item_timeout_s=item_timeout(spec), pilot_item_s=pilot_item_s(spec),
                    in_flight=int(vspec.in_flight or 1), prefetch=int(vspec.prefetch),
                    spawn=spawn)
    t1 = time.perf_counter()
    driver.run()
    seconds = time.perf_counter() - t1
    assert ledger.count() == len(items) and ledger.re_executed() == 0
    outputs = [row.output for row in ledger.rows()]
    assert all(o for o in outputs), "an accepted input without its output"
    ledger.close()
    writer.close()
    for w in actors:
        ray.kill(w.actor)
    return {"rate": len(items) / seconds, "seconds": seconds, "actors_s": started,
            "busy_s": driver.recording_s, "prefetch": driver.prefetch}


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else (400 if SMOKE else 20_000)
    from runner import volume_ray
    from runner.volume_workers import CPU_WORKERS_MAX

    workers = min(CPU_WORKERS_MAX, os.cpu_count() or 1)  # the embedded default's, as run_volume

    with tempfile.TemporaryDirectory(prefix="bench-volume-overhead-") as tmp:
        root = Path(tmp)
        spec = make_spec(root, count)
        assert spec.volume is not None
        volume_ray.prepare_env(spec.volume)
        ray = volume_ray.import_ray()
        t0 = time.perf_counter()
        volume_ray.start(ray, spec.volume, str(root), workers)
        ray_start = time.perf_counter() - t0
        rounds: list[tuple[float, dict[str, float]]] = []
        try:  # interleaved, Ray up for both: each side meets the same load
            for r in range(ROUNDS):
                rounds.append((plain(spec, root, workers, root / f"plain-{r}"),
                               on_ray(ray, spec, root / f"run-{r}", workers)))
        finally:
            volume_ray.stop(ray, [], str(root))
    loops = max(p for p, _v in rounds)
    vol = max((v for _p, v in rounds), key=lambda v: v["rate"])
    ratio = vol["rate"] / loops
    print(f"inputs: {count}, batches of {BATCH}, handler: a {WARMUP_S:g} s warm-up at its "
          f"first call in each process, then {FIXED_S * 1000:g} ms + "
          f"{PER_ITEM_S * 1000:g} ms per item a batch, a JSON output per input; "
          f"{workers} worker(s), {os.cpu_count()} CPU(s), ray {ray.__version__}")
    for r, (p, v) in enumerate(rounds, 1):
        print(f"round {r}: plain loops {p:.0f} items/s, volume {v['rate']:.0f} items/s")
    print(f"plain loops ({workers} processes, a plain file per output), the best of "
          f"{ROUNDS}: {loops:.0f} items/s")
    print(f"volume ({workers} workers, read ahead {vol['prefetch']:g}, outputs in one shard "
          f"per batch, ledger, events), the best of {ROUNDS}: "
          f"{vol['rate']:.0f} items/s in {vol['seconds']:.2f} s (recording thread busy "
          f"{vol['busy_s']:.2f} s of them)")
    print(f"ray start: {ray_start:.1f} s, {workers} actors: {vol['actors_s']:.1f} s "
          "(once per volume, not counted; fresh actors each round)")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"volume_vs_plain_loops: {ratio:.3f} (target >= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
