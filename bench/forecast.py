"""Does the volume take what the pilot's forecast said? A pilot of 12 items, then its
volume of 2,000 on a local Ray, through the real `preflight` command (service, runner,
store) on a temp PREFLIGHT_HOME.

The handler waits (a sleep: the CPU stays free, as while a device computes) for a time
written in each input: log-normal, median 15 ms, sigma 0.5 (mean about 17 ms, a tail to
about 80 ms). The volume's 2,000 times are drawn with a fixed seed; the pilot's 12 are the
distribution's quantiles (k + 0.5) / 12, a pilot that covers the range as a team would
pick it. The pilot's items are timed one by one (task.batch_size 1); the volume runs
batches of 16 on one CPU worker per core (at most 4). `preflight run` runs the pilot and
stores its forecast; `preflight decide PILOT approve` launches the volume and follows it;
the volume's check (`preflight show VOLUME --json` → forecast) sets its actual processing time (its
work stage, Ray's start included) beside the forecast's middle and range.

Target: the actual within 15 % of the forecast's middle and inside its range. The last
line: `forecast_error: <error>% (target ...) PASS|MISS`. PREFLIGHT_BENCH_SMOKE=1: a volume
of 100 items (a smoke run that checks the bench runs to its verdict line, not the target).
Usage: .venv/bin/python bench/forecast.py [VOLUME_ITEMS]
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
PILOT = 12
TARGET_PCT = 15.0
MEDIAN_S, SIGMA = 0.015, 0.5
HANDLER = '''
import time
from pathlib import Path


def handle(items, ctx):
    out = []
    for item in items:
        time.sleep(float(Path(item.path).read_text()))
        out.append({"id": item.id, "status": "accepted", "category": "done"})
    return out
'''
MANIFEST = '''apiVersion: preflight/v1
name: bench-forecast
purpose: inference
hardware: {{gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0.00"}}
backend: cpu
preparation: pytorch
node: {{kind: local}}
project: {{dir: .., requirements: requirements-rebuild.txt, python: ">=3.9"}}
inputs: {{dir: pilot, pattern: "*.txt", expected_count: {pilot}}}
task: {{kind: classify, handler: "bench_handler:handle", categories: [done], batch_size: 1}}
diagnostics: {{extensions: [], min_free_disk_gib: 0.1}}
success: {{min_accepted: {pilot}, max_refused: 0, balance_ok: true}}
results: {{copy_to: evidence/bench-forecast}}
approvals: {{approvers: [alice], two_person: false}}
volume:
  inputs: {{dir: corpus, pattern: "*.txt", expected_count: {volume}}}
  batch_size: 16
'''


def normal_quantile(p: float) -> float:
    return statistics.NormalDist().inv_cdf(p)


def make_project(root: Path, volume: int) -> None:
    (root / "manifests").mkdir(parents=True)
    (root / "pilot").mkdir()
    (root / "corpus").mkdir()
    shutil.copy(REPO / "requirements-rebuild.txt", root / "requirements-rebuild.txt")
    (root / "bench_handler.py").write_text(HANDLER)
    (root / "manifests" / "bench.yaml").write_text(MANIFEST.format(pilot=PILOT, volume=volume))
    for k in range(PILOT):
        seconds = MEDIAN_S * math.exp(SIGMA * normal_quantile((k + 0.5) / PILOT))
        (root / "pilot" / f"p-{k:02d}.txt").write_text(f"{seconds:.6f}")
    rng = random.Random(20261203)
    for k in range(volume):
        seconds = rng.lognormvariate(math.log(MEDIAN_S), SIGMA)
        (root / "corpus" / f"v-{k:05d}.txt").write_text(f"{seconds:.6f}")


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
    volume = int(sys.argv[1]) if len(sys.argv) > 1 else (100 if SMOKE else 2_000)
    try:
        return measure(volume)
    except (RuntimeError, StopIteration, subprocess.TimeoutExpired) as exc:
        print(f"the bench could not measure: {type(exc).__name__}: {exc}")
        print(f"forecast_error: n/a (target within {TARGET_PCT:g}% of the middle) MISS")
        return 1


def measure(volume: int) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-forecast-") as tmp:
        root = Path(tmp) / "project"
        make_project(root, volume)
        began = time.monotonic()
        done = preflight(root, "run", "manifests/bench.yaml")
        if done.returncode == 0:
            runs = as_json(preflight(root, "runs", "--json"))
            pilot_id = next(r["id"] for r in runs if r["kind"] == "pilot")
            # the approval launches the volume and follows it to its end
            done = preflight(root, "decide", pilot_id, "approve", "--reason", "bench",
                             "--by", "alice")
        took = time.monotonic() - began
        if done.returncode != 0:
            print(done.stdout[-3000:], done.stderr[-3000:], sep="\n")
            print(f"forecast_error: n/a (target within {TARGET_PCT:g}% of the middle) MISS")
            return 1
        runs = as_json(preflight(root, "runs", "--json"))
        pilot = show(root, pilot_id)
        vol = show(root, next(r["id"] for r in runs if r["kind"] == "volume"))
    fc, check = pilot.get("forecast") or {}, vol.get("forecast") or {}
    if not fc.get("possible") or "actual_s" not in check:
        print(f"no forecast or no check: {fc.get('reason')} / {check}")
        print(f"forecast_error: n/a (target within {TARGET_PCT:g}% of the middle) MISS")
        return 1
    for key in ("workers", "mean_s", "sd_s", "units", "setup_s", "proc_low_s", "proc_mid_s",
                "proc_high_s"):
        print(f"forecast {key}: {fc.get(key)}")
    print(f"volume of {volume:,} items: actual {check['actual_s']:.2f} s over "
          f"{check['attempts']} attempt(s); forecast middle {check['forecast_mid_s']:.2f} s, "
          f"range {check['forecast_low_s']:.2f} – {check['forecast_high_s']:.2f} s "
          f"(pilot + volume through `preflight run`: {took:.1f} s)")
    print(f"check: {check['formula']}")
    error = float(check["error_pct"])
    inside = bool(check["within_range"])
    ok = abs(error) <= TARGET_PCT and inside
    print(f"forecast_error: {error:+.1f}% (target within {TARGET_PCT:g}% of the middle and "
          f"inside the range: {'inside' if inside else 'outside'}) {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
