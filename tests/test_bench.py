"""Every bench in bench/ runs to its verdict line at its smoke size (PREFLIGHT_BENCH_SMOKE=1).

A smoke run checks that the bench still works (a bench that breaks fails here), not its
target: PASS and MISS are both fine; the full size is for the verdict. The benches are
found by glob, so a new one is smoked without touching this file.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BENCHES = sorted((REPO / "bench").glob("*.py"))
# `<metric>: <value> (target <target>) PASS|MISS`, the last line of every bench.
VERDICT = re.compile(r"^[a-z][a-z0-9_]*: \S+ \(target [^()]+\) (PASS|MISS)$")
TIMEOUT_S = 240  # smoke sizes take seconds; this only stops a bench that hangs


def test_the_verdict_line_format() -> None:
    assert VERDICT.match("ack_p99_ratio: 1.12 (target 1.2) PASS")
    assert VERDICT.match("watcher_cpu_share: 3.20% (target <= 2%) MISS")
    assert VERDICT.match("ledger_vs_bare_ratio: 0.85 (target >= 0.80, resume scan < 0.5 s) PASS")
    assert not VERDICT.match("remote_overhead_s_per_pilot (first dispatch): 0.93 (target < 3) PASS")
    assert not VERDICT.match("runner_frame_overhead: n/a (target 0.10)")
    assert BENCHES, "no bench found in bench/"


# The benches that need a system package, and what each needs: found in their source, so a
# new one that starts sshd or Blender without joining this list fails the test below.
NEEDS = {"blender": "blender", "million": "sshd", "remote": "sshd"}


def test_every_bench_that_needs_sshd_or_blender_is_checked_without_it() -> None:
    found = {b.stem for b in BENCHES
             if re.search(r"\bsshd\b|which\(\"blender\"\)", b.read_text(encoding="utf-8"))}
    assert found == set(NEEDS)


@pytest.mark.parametrize("stem", sorted(NEEDS))
def test_a_bench_whose_system_dependency_is_missing_names_it_in_its_verdict(
        stem: str, tmp_path: Path) -> None:
    """PATH without sshd or blender (an empty folder) and no sshd where the test kit looks
    (PREFLIGHT_SSHD): the bench ends with its verdict line, MISS, naming what is missing
    and how to install it; no traceback; exit 1 (the README's "could not measure")."""
    (tmp_path / "bin").mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update(PATH=str(tmp_path / "bin"), PREFLIGHT_SSHD=str(tmp_path / "no" / "sshd"),
               PREFLIGHT_BENCH_SMOKE="1", PREFLIGHT_HOME=str(tmp_path / "home"))
    done = subprocess.run([sys.executable, str(REPO / "bench" / f"{stem}.py")], cwd=REPO,
                          env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=120, check=False)
    said = f"exit {done.returncode}\nstdout:\n{done.stdout[-2000:]}\nstderr:\n{done.stderr[-2000:]}"
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 1 and "Traceback" not in done.stderr, said
    assert VERDICT.match(last) and last.endswith(" MISS"), said
    assert f"not run: {NEEDS[stem]} not found" in last and "make system-deps" in last, said


@pytest.mark.slow
@pytest.mark.parametrize("bench", BENCHES, ids=[b.stem for b in BENCHES])
def test_bench_runs_to_its_verdict_at_smoke_size(bench: Path, tmp_path: Path) -> None:
    if bench.stem == "blender" and shutil.which("blender") is None:
        pytest.skip("bench/blender.py needs the `blender` binary (make system-deps)")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update(PREFLIGHT_BENCH_SMOKE="1", PREFLIGHT_HOME=str(tmp_path / "home"))
    try:
        done = subprocess.run([sys.executable, str(bench)], cwd=REPO, env=env,
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{bench.name} did not finish in {TIMEOUT_S} s at smoke size:\n"
                    f"{(exc.stdout or b'')[-2000:]!r}")
    lines = done.stdout.strip().splitlines()
    said = f"{bench.name} exit {done.returncode}\nstdout:\n{done.stdout[-3000:]}\n" \
           f"stderr:\n{done.stderr[-3000:]}"
    assert done.returncode == 0, said
    assert lines and VERDICT.match(lines[-1]), said
