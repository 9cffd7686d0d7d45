"""Does the volume take what the pilot's forecast said? Four handlers a new user writes,
each through the real `preflight` command (service, runner, store) on a temp
PREFLIGHT_HOME: a pilot of 12 items (batches of 4) with its calibration on the volume's
own inputs, then its volume on a local Ray (batches of 16), approved with `preflight
decide PILOT approve`; the volume's check (`preflight show VOLUME --json` → forecast) sets
its work stage's actual time (Ray's start included) beside the forecast's middle and range.

- ``warmup``: the first call of each worker sleeps 2 s (a model load), then 4 ms per item;
- ``fixed``: 150 ms per batch (a launch, a transfer) + 2 ms per item;
- ``driver``: no work at all and a JSON output per item: the driver's recording bounds it;
- ``size``: 1 ms per KB of input, inputs from 1 to 40 KB.

The handlers wait (sleeps: the CPU stays free, as while a device computes), except the
driver-bound one. Target, for each: the actual within 20 % of the forecast's middle, inside
its range, and the range's high ÷ low of the processing at most 2. The last line:
`forecast_error: <worst error>% (target ...) PASS|MISS`. PREFLIGHT_BENCH_SMOKE=1: the
``fixed`` handler alone on a volume of 100 items (a smoke run that checks the bench runs
to its verdict line, not the target).
Usage: .venv/bin/python bench/forecast.py [VOLUME_ITEMS] [HANDLER ...]
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
PILOT = 12
TARGET_PCT = 20.0
TARGET_RATIO = 2.0
HANDLERS = {
    "warmup": '''
import time

_model = []


def handle(items, ctx):
    if not _model:
        time.sleep(2.0)
        _model.append("loaded")
    time.sleep(0.004 * len(items))
    return [{"id": i.id, "status": "accepted", "category": "done"} for i in items]
''',
    "fixed": '''
import time


def handle(items, ctx):
    time.sleep(0.15 + 0.002 * len(items))
    return [{"id": i.id, "status": "accepted", "category": "done"} for i in items]
''',
    "driver": '''
def handle(items, ctx):
    return [{"id": i.id, "status": "accepted", "category": "done",
             "output": {"label": "done", "score": 0.5, "id": i.id}} for i in items]
''',
    "size": '''
import os
import time


def handle(items, ctx):
    for item in items:
        time.sleep(0.001 * os.path.getsize(item.path) / 1024)
    return [{"id": i.id, "status": "accepted", "category": "done"} for i in items]
''',
}
# the volume's size by handler (the driver-bound one needs many items to be bound)
VOLUME = {"warmup": 2_000, "fixed": 2_000, "driver": 6_000, "size": 1_000}
MANIFEST = '''apiVersion: preflight/v1
name: bench-forecast-{kind}
purpose: inference
hardware: {{gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0.00"}}
backend: cpu
preparation: pytorch
node: {{kind: local}}
project: {{dir: .., requirements: requirements-rebuild.txt, python: ">=3.9"}}
inputs: {{dir: pilot, pattern: "*.txt", expected_count: {pilot}}}
task: {{kind: classify, handler: "bench_handler:handle", categories: [done], batch_size: 4}}
diagnostics: {{extensions: [], min_free_disk_gib: 0.1}}
success: {{min_accepted: {pilot}, max_refused: 0, balance_ok: true}}
results: {{copy_to: evidence/bench-forecast}}
approvals: {{approvers: [alice], two_person: false}}
volume:
  inputs: {{dir: corpus, pattern: "*.txt", expected_count: {volume}}}
  batch_size: 16
'''


def make_project(root: Path, kind: str, volume: int) -> None:
    (root / "manifests").mkdir(parents=True)
    (root / "pilot").mkdir()
    (root / "corpus").mkdir()
    shutil.copy(REPO / "requirements-rebuild.txt", root / "requirements-rebuild.txt")
    (root / "bench_handler.py").write_text(HANDLERS[kind])
    (root / "manifests" / "bench.yaml").write_text(
        MANIFEST.format(kind=kind, pilot=PILOT, volume=volume))
    rng = random.Random(20261205)
    for folder, count, prefix in (("pilot", PILOT, "p"), ("corpus", volume, "v")):
        for k in range(count):
            kib = rng.uniform(1, 40) if kind == "size" else 0.01
            (root / folder / f"{prefix}-{k:05d}.txt").write_text("x" * int(kib * 1024))


def preflight(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update(PREFLIGHT_HOME=str(root), COLUMNS="120")
    return subprocess.run([sys.executable, "-m", "bot", *args], cwd=root, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=1800, check=False)


def as_json(done: subprocess.CompletedProcess[str]) -> Any:
    """What a `--json` command printed; its output and error when it printed no JSON."""
    try:
        return json.loads(done.stdout)
    except ValueError as exc:
        raise RuntimeError(f"`preflight {' '.join(done.args[3:])}` exit {done.returncode}: "
                           f"{done.stdout[-1500:]}{done.stderr[-1500:]}") from exc


def show(root: Path, run_id: str) -> dict[str, Any]:
    return dict(as_json(preflight(root, "show", run_id, "--json")))


def main() -> int:
    args = sys.argv[1:]
    size = int(args.pop(0)) if args and args[0].isdigit() else None
    kinds = args or (["fixed"] if SMOKE else list(HANDLERS))
    worst, ok = 0.0, True
    for kind in kinds:
        volume = size or (100 if SMOKE else VOLUME[kind])
        try:
            error, passed = measure(kind, volume)
        except (RuntimeError, StopIteration, subprocess.TimeoutExpired) as exc:
            print(f"{kind}: the bench could not measure: {type(exc).__name__}: {exc}")
            error, passed = float("inf"), False
        worst = max(worst, abs(error))
        ok = ok and passed
    shown = "n/a" if worst == float("inf") else f"{worst:.1f}"
    print(f"forecast_error: {shown}% (target every handler within {TARGET_PCT:g}% of the "
          f"middle, inside the range, processing range high/low <= {TARGET_RATIO:g}) "
          f"{'PASS' if ok else 'MISS'}")
    return 0


def measure(kind: str, volume: int) -> tuple[float, bool]:
    """One handler's pilot and volume: (error against the middle in %, target met)."""
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        keep = os.environ.get("PREFLIGHT_BENCH_KEEP")  # a folder to keep the runs in
        root = Path(keep) / kind if keep else Path(tmp) / "project"
        make_project(root, kind, volume)
        began = time.monotonic()
        done = preflight(root, "run", "manifests/bench.yaml")
        pilot_id = ""
        if done.returncode == 0:
            runs = as_json(preflight(root, "runs", "--json"))
            pilot_id = next(r["id"] for r in runs if r["kind"] == "pilot")
            # the approval launches the volume and follows it to its end
            done = preflight(root, "decide", pilot_id, "approve", "--reason", "bench",
                             "--by", "alice")
        took = time.monotonic() - began
        if done.returncode != 0:
            raise RuntimeError(f"exit {done.returncode}: {done.stdout[-2000:]}"
                               f"{done.stderr[-2000:]}")
        runs = as_json(preflight(root, "runs", "--json"))
        pilot = show(root, pilot_id)
        vol = show(root, next(r["id"] for r in runs if r["kind"] == "volume"))
    fc, check = pilot.get("forecast") or {}, vol.get("forecast") or {}
    if not fc.get("possible") or "actual_s" not in check:
        raise RuntimeError(f"no forecast or no check: {fc.get('reason')} / {check}")
    for key in ("workers", "calibrated", "batch_s", "batch_spread_s", "warmup_s",
                "recording_s", "ray_start_s", "proc_low_s", "proc_mid_s", "proc_high_s"):
        print(f"{kind} forecast {key}: {fc.get(key)}")
    ratio = float(fc["proc_high_s"]) / max(float(fc["proc_low_s"]), 1e-9)
    error = float(check["error_pct"])
    inside = bool(check["within_range"])
    passed = abs(error) <= TARGET_PCT and inside and ratio <= TARGET_RATIO
    print(f"{kind}: volume of {volume:,} items: actual {check['actual_s']:.2f} s; forecast "
          f"middle {check['forecast_mid_s']:.2f} s, range {check['forecast_low_s']:.2f} – "
          f"{check['forecast_high_s']:.2f} s; error {error:+.1f}%, "
          f"{'inside' if inside else 'outside'}, processing range high/low {ratio:.2f} "
          f"({'PASS' if passed else 'MISS'}; pilot + volume {took:.0f} s)")
    print(f"{kind} check: {check['formula']}")
    return error, passed


if __name__ == "__main__":
    sys.exit(main())
