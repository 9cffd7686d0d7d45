"""Wall time of the whole runner ladder on CPU against a bare ``import torch``.

Both are measured in this invocation, as fresh processes of the same interpreter, median
of ROUNDS: the baseline is ``python -c "import torch"``; the ladder is
``python -m runner`` on the 12-document demo pilot (every stage: prepare ... evidence,
torch imported once in the watchdog's worker, the pilot classifying all 12 documents).
Target: the ladder adds less than 3 seconds over the import. PREFLIGHT_BENCH_SMOKE=1: one
round, no warm-up (a smoke run that checks the bench runs to its verdict line).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
ROUNDS = 1 if SMOKE else 3
TARGET_S = 3.0


def timed(argv: list[str]) -> float:
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{argv[1:4]} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return elapsed


def demo_spec(root: Path, n: int) -> Path:
    spec = {
        "run_id": f"bench-{n}", "name": "bench-diagnostics", "backend": "cpu",
        "python": ">=3.9", "project": {"dir": str(REPO)},
        "inputs": {"dir": str(REPO / "data" / "pilote"), "pattern": "doc-*.txt",
                   "expected_count": 12, "expected_refusals": ["doc-07"]},
        "task": {"kind": "classify", "handler": "runner.workloads.classify:handle",
                 "categories": ["invoice", "contract", "support", "research"],
                 "batch_size": 4},
    }
    path = root / f"spec-{n}.json"
    path.write_text(json.dumps(spec))
    return path


def stage_seconds(run_dir: Path) -> dict[str, float]:
    env = json.loads((run_dir / "environment.json").read_text())
    return {name: rec.get("seconds") or 0.0 for name, rec in env["stages"].items()}


def main() -> int:
    python = sys.executable
    baseline, ladder = [], []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        if not SMOKE:
            timed([python, "-c", "import torch"])  # warm the page cache for both
        for n in range(ROUNDS):
            baseline.append(timed([python, "-c", "import torch"]))
            run_dir = root / f"run-{n}"
            ladder.append(timed([python, "-m", "runner", str(demo_spec(root, n)),
                                 "--run-dir", str(run_dir)]))
        stages = stage_seconds(root / f"run-{ROUNDS - 1}")
    base, full = statistics.median(baseline), statistics.median(ladder)
    added = full - base
    print(f"rounds: {ROUNDS} (median), python {sys.version.split()[0]}")
    print(f"bare `python -c 'import torch'` (baseline): {base:.2f} s")
    print(f"python -m runner, 12-document demo, all 11 stages: {full:.2f} s "
          f"(ratio {full / base:.2f}x)")
    print("stage seconds (last round): " + ", ".join(f"{k} {v:.2f}" for k, v in stages.items()))
    verdict = "PASS" if added < TARGET_S else "MISS"
    print(f"ladder_added_seconds: {added:.2f} (target < {TARGET_S:g}) {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
