"""A volume whose handler returns a small JSON output per input, against plain loops.

The same handler (a sleep per batch, a fixed part and a per-item part, standing in for a
card's time; one small JSON output per input), in this one invocation:

- plain: as many plain processes as the volume has workers, each looping over its share
  of the inputs batch after batch and writing each output to a plain file (open, write,
  close: no fsync, no ledger, no events): what a team would write by hand;
- volume: the volume's driver (``runner.volume.Driver``) on a local Ray with the embedded
  default's workers (one per core, at most 4), the real worker actors (each batch's outputs
  in one shard on the worker's node, one fsync), the ledger and the events file.

Throughput: plain, from the first process's start to the last one's end (interpreters and
handlers loaded before); volume, from the first batch handed out to the last item recorded
(Ray's start and the actors', paid once per volume, printed beside). Ratio = volume ÷
plain, target >= 0.9 on the shared 2-core build machine. Also printed: how long the
driver's recording thread was busy (what the hand-out loop no longer waits for).
Usage: .venv/bin/python bench/volume_outputs.py [ITEMS]; PREFLIGHT_BENCH_SMOKE=1: 400
inputs in batches of 16 (checks that the bench runs to its verdict line, not the target).
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

from runner.inputs import list_dir  # noqa: E402
from runner.ledger import Ledger  # noqa: E402
from runner.spec import RunSpec  # noqa: E402
from runner.stage import StageContext  # noqa: E402
from runner.stages.pilot import Recorder  # noqa: E402

TARGET = 0.9
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
BATCH = 16 if SMOKE else 64
FIXED_S, PER_ITEM_S = 0.010, 0.0005  # a batch of 64: 42 ms, about 1,500 items/s a worker
HANDLER = '''
import time

def handle(items, ctx):
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


def make_spec(root: Path, count: int, workers: int) -> RunSpec:
    inputs = root / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (inputs / f"i{i:06d}.txt").write_text("x")
    (root / "benchwork.py").write_text(HANDLER)
    return RunSpec.from_dict({
        "run_id": "bench", "name": "bench", "project": {"dir": str(root)},
        "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": count},
        "task": {"handler": "benchwork:handle", "categories": ["x"], "batch_size": BATCH,
                 "params": {"fixed_s": FIXED_S, "per_item_s": PER_ITEM_S}},
        "volume": {"workers": workers, "batch_size": BATCH, "in_flight": 2}})


def plain(spec: RunSpec, root: Path, workers: int) -> float:
    """Items/s of ``workers`` plain processes, each over its share."""
    items = list_dir(spec.inputs.dir, spec.inputs.pattern)
    out = root / "plain-out"
    out.mkdir()
    script = root / "plain.py"
    script.write_text(PLAIN)
    params = json.dumps({"fixed_s": FIXED_S, "per_item_s": PER_ITEM_S})
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
    from runner.volume import Batch, Driver, _start_workers, _worker_factory

    run_dir.mkdir(parents=True)
    ctx = StageContext(spec=spec, run_dir=str(run_dir))
    items = list_dir(spec.inputs.dir, spec.inputs.pattern)
    ledger = Ledger.open(str(run_dir / "ledger.sqlite"), new_attempt=True)
    recorder = Recorder(ctx, ledger, items, set())
    t0 = time.perf_counter()
    actors = _start_workers(ctx, ray, spec.volume, workers,
                            _worker_factory(ctx, ray, spec.volume))
    started = time.perf_counter() - t0
    batches = [Batch(n, items[i:i + BATCH]) for n, i in enumerate(range(0, len(items), BATCH))]
    driver = Driver(ctx, recorder, ray, actors, batches, 0.0, in_flight=2)
    t1 = time.perf_counter()
    driver.run()
    seconds = time.perf_counter() - t1
    assert ledger.count() == len(items) and ledger.re_executed() == 0
    outputs = [row.output for row in ledger.rows()]
    assert all(o for o in outputs), "an accepted input without its output"
    ledger.close()
    for w in actors:
        ray.kill(w.actor)
    return {"rate": len(items) / seconds, "seconds": seconds, "actors_s": started,
            "busy_s": float(getattr(driver, "recording_s", float("nan")))}


def main() -> int:
    count = int(sys.argv[1]) if len(sys.argv) > 1 else (400 if SMOKE else 20_000)
    workers = min(4, os.cpu_count() or 1)  # the embedded default's CPU workers
    from runner import volume_ray

    with tempfile.TemporaryDirectory(prefix="bench-volume-outputs-") as tmp:
        root = Path(tmp)
        spec = make_spec(root, count, workers)
        assert spec.volume is not None
        loops = plain(spec, root, workers)  # before Ray starts: nothing else running
        volume_ray.prepare_env(spec.volume)
        ray = volume_ray.import_ray()
        t0 = time.perf_counter()
        volume_ray.start(ray, spec.volume, str(root), workers)
        ray_start = time.perf_counter() - t0
        try:
            vol = on_ray(ray, spec, root / "run", workers)
        finally:
            volume_ray.stop(ray, [], str(root))
    ratio = vol["rate"] / loops
    print(f"inputs: {count}, batches of {BATCH}, handler {FIXED_S * 1000:g} ms + "
          f"{PER_ITEM_S * 1000:g} ms per item a batch, a JSON output per input; "
          f"{workers} worker(s), {os.cpu_count()} CPU(s), ray {ray.__version__}")
    print(f"plain loops ({workers} processes, a plain file per output): {loops:.0f} items/s")
    print(f"volume ({workers} workers, outputs in one shard per batch, ledger, events): "
          f"{vol['rate']:.0f} items/s in {vol['seconds']:.2f} s (recording thread busy "
          f"{vol['busy_s']:.2f} s of them)")
    print(f"ray start: {ray_start:.1f} s, {workers} actors: {vol['actors_s']:.1f} s "
          "(once per volume, not counted)")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"volume_vs_plain_loops: {ratio:.3f} (target >= {TARGET}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
