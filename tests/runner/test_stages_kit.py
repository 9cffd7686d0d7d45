"""Shared helpers for the runner's stage tests: tiny specs, a tiny workload, a real runner.

Every test here runs ``python -m runner`` as a real subprocess on a spec written into
``tmp_path``, with a tiny handler module (``tinywork``) and user checks (``tinycheck``) in a
project folder of its own, so the tests depend on neither the demo data nor its workload.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from runner.events import Event, read_events

REPO = Path(__file__).resolve().parents[2]

TINYWORK = '''
def handle(items, ctx):
    hog = int(ctx.params.get("hog_mib", 0))
    ballast = b"\\x01" * (hog << 20) if hog else b""
    out = []
    for item in items:
        with open(item.path, "rb") as fh:
            data = fh.read()
        if not data.strip():
            out.append({"id": item.id, "status": "refused", "reason": "empty input"})
        else:
            out.append({"id": item.id, "status": "accepted",
                        "category": "long" if len(data) > 20 else "short"})
    del ballast
    return out
'''

TINYCHECK = '''
import os, sys, time


def fine():
    return {"answer": 42}


def helper(name):
    raise RuntimeError(name + ": libfoo.so.1: cannot open shared object file")


def boom():
    helper("boom")


def crash(items, ctx):
    helper("crash")


def hang():
    flag = os.environ.get("TINYCHECK_PIDFILE")
    if flag:
        import subprocess
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
        with open(flag + ".tmp", "w") as fh:
            fh.write("%d %d" % (os.getpid(), child.pid))
        os.replace(flag + ".tmp", flag)
    time.sleep(120)
'''


def deep_merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def write_spec(tmp_path: Path, **overrides: Any) -> Path:
    """A three-input pilot spec in tmp_path; keyword arguments are deep-merged into it."""
    project = tmp_path / "project"
    inputs = project / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    (inputs / "a1.txt").write_text("short one")
    (inputs / "a2.txt").write_text("a rather longer input text " * 4)
    (inputs / "a3.txt").write_text("tiny")
    (project / "tinywork.py").write_text(TINYWORK)
    (project / "tinycheck.py").write_text(TINYCHECK)
    spec = {
        "run_id": "r-test", "name": "tiny", "backend": "cpu", "python": ">=3.9",
        "project": {"dir": str(project)},
        "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": 3,
                   "expected_refusals": []},
        "task": {"kind": "classify", "handler": "tinywork:handle",
                 "categories": ["short", "long"], "batch_size": 2},
        "diagnostics": {"timeouts": {}},
    }
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(deep_merge(spec, overrides)))
    return path


def runner_env(*extra_paths: Path | str, **env: str) -> dict[str, str]:
    base = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    base["PYTHONPATH"] = os.pathsep.join([*(str(p) for p in extra_paths), str(REPO)])
    base.update(env)
    return base


def run_runner(spec: Path, run_dir: Path, *args: str, python: str = sys.executable,
               flags: tuple[str, ...] = (), env: dict[str, str] | None = None,
               timeout: float = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [python, *flags, "-m", "runner", str(spec), "--run-dir", str(run_dir), *args],
        capture_output=True, text=True, timeout=timeout, env=env or runner_env(), cwd=REPO,
        check=False)


def failed_run(spec: Path, run_dir: Path, **kw: Any) -> list[Event]:
    """Run the runner on ``spec`` (``run_runner``'s options in ``kw``); it must fail with
    exit code 1: its events, checked as ``events_of`` checks them."""
    done = run_runner(spec, run_dir, **kw)
    assert done.returncode == 1, done.stderr[-3000:]
    return events_of(run_dir)


def events_of(run_dir: Path) -> list[Event]:
    """All events of the run, checked well-formed with seq 1..n."""
    events, offset = read_events(str(run_dir / "events.jsonl"))
    assert offset == (run_dir / "events.jsonl").stat().st_size, "torn last line"
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[0].type == "run.started" and events[-1].type == "run.finished"
    return events


def outcomes(events: list[Event]) -> dict[str, Event]:
    """The final event (passed, failed, skipped) of each stage."""
    return {e.data["stage"]: e for e in events
            if e.type in ("stage.passed", "stage.failed", "stage.skipped")}


def status_of(events: list[Event]) -> dict[str, str]:
    return {name: e.type.split(".")[1] for name, e in outcomes(events).items()}


def finished(events: list[Event]) -> dict[str, Any]:
    return events[-1].data


def start_hanging_runner(tmp_path: Path, *, stderr: int = subprocess.DEVNULL
                         ) -> tuple[subprocess.Popen[bytes], Path, int, int]:
    """`python -m runner` stuck in a user check that hangs (and starts a grandchild).

    Returns the runner process, its run directory, the worker's pid and the grandchild's,
    once the check is running.
    """
    from tests.processes import wait_until

    pidfile = tmp_path / "hang.pids"
    spec = write_spec(tmp_path, diagnostics={"checks": ["tinycheck:hang"]})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", str(spec), "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=stderr, cwd=REPO,
        env=runner_env(TINYCHECK_PIDFILE=str(pidfile)))
    try:
        wait_until(pidfile.exists, "the hanging check to start")
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    worker_pid, grandchild = (int(p) for p in pidfile.read_text().split())
    return proc, run_dir, worker_pid, grandchild
