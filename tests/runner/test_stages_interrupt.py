"""Signals and hangs in the runner process itself, produced for real.

A SIGTERM (or Ctrl-C) to ``python -m runner`` fails the running stage with ``Interrupted``,
skips every later stage with the reason, and still ends the file with ``run.finished``.
A stage that runs in the runner process (here ``environment``, blocked opening a FIFO
included with ``-r``, as a hung network mount would block it) fails at its timeout while
the ladder goes on.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Callable

from tests.processes import alive, wait_until
from tests.runner.test_stages_kit import (
    REPO,
    events_of,
    failed_run,
    finished,
    outcomes,
    runner_env,
    start_hanging_runner,
    status_of,
    write_spec,
)

ALL = ["prepare", "interpreter", "environment", "torch", "device", "compute", "interconnect",
       "extensions", "memory", "pilot", "collect", "balance", "calibrate", "evidence"]


def _started(run_dir: Path, stage: str) -> Callable[[], bool]:
    def check() -> bool:
        path = run_dir / "events.jsonl"
        if not path.exists():
            return False
        for line in path.read_text().splitlines():
            event = json.loads(line) if line.endswith("}") else {}
            if event.get("type") == "stage.started" and event.get("stage") == stage:
                return True
        return False
    return check


def _blocking_requirements(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir(exist_ok=True)
    os.mkfifo(project / "hung.txt")  # opening it blocks until a writer comes: never
    (project / "requirements.txt").write_text("PyYAML>=5.1\n-r hung.txt\n")


def _signal(proc: subprocess.Popen[bytes], sig: int, *,
            once: Callable[[], bool] | None = None, what: str = "") -> bytes:
    """Send ``sig`` to the runner (once ``once`` holds) and wait for its end: its stderr.
    A runner still there after the wait, or after a failed one, is killed."""
    try:
        if once is not None:
            wait_until(once, what)
        proc.send_signal(sig)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return stderr


def _assert_interrupted(run_dir: Path, stage: str, signame: str) -> None:
    events = events_of(run_dir)  # whole lines, seq 1..n, ends with run.finished
    status = status_of(events)
    assert list(status) == ALL  # every stage reported exactly once
    error = outcomes(events)[stage].data["error"]
    assert status[stage] == "failed"
    assert error["type"] == "Interrupted" and error["message"] == f"runner interrupted by {signame}"
    assert "preflight resume RUN" in error["hint"] and "--resume" not in error["hint"]
    later = ALL[ALL.index(stage) + 1:]
    assert later
    for name in later:
        event = outcomes(events)[name]
        assert event.type == "stage.skipped", name
        assert event.data["reason"] == f"runner interrupted by {signame}"
        assert event.data["blocking"] is True
    end = finished(events)
    assert end["status"] == "failed" and end["stage_reached"] == stage
    assert end["first_error"]["stage"] == stage
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["first_error"]["type"] == "Interrupted"
    assert set(env["stages"]) == set(ALL)
    assert not list(run_dir.glob("*.tmp*"))


def test_sigterm_during_a_worker_stage(tmp_path: Path) -> None:
    proc, run_dir, worker_pid, grandchild = start_hanging_runner(tmp_path,
                                                                 stderr=subprocess.PIPE)
    stderr = _signal(proc, signal.SIGTERM)
    assert proc.returncode == 1, stderr
    assert b"Traceback" not in stderr
    _assert_interrupted(run_dir, "extensions", "SIGTERM")
    # the worker and what the user's check started went with the worker's process group
    assert not alive(worker_pid) and not alive(grandchild)


def test_sigint_during_a_runner_process_stage(tmp_path: Path) -> None:
    _blocking_requirements(tmp_path)
    spec = write_spec(tmp_path, project={"requirements": "requirements.txt"})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", str(spec), "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=REPO, env=runner_env())
    stderr = _signal(proc, signal.SIGINT, once=_started(run_dir, "environment"),
                     what="the environment stage to start")
    assert proc.returncode == 1, stderr
    assert b"Traceback" not in stderr and b"KeyboardInterrupt" not in stderr
    _assert_interrupted(run_dir, "environment", "SIGINT")


def test_runner_process_stage_that_hangs_past_its_timeout(tmp_path: Path) -> None:
    _blocking_requirements(tmp_path)
    spec = write_spec(tmp_path, project={"requirements": "requirements.txt"},
                      diagnostics={"timeouts": {"environment": 2}})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir, timeout=120)
    status = status_of(events)
    error = outcomes(events)["environment"].data["error"]
    assert status["environment"] == "failed"
    assert error["type"] == "Timeout"
    assert error["message"] == "stage environment timed out after 2 s"
    assert "diagnostics.timeouts.environment" in error["hint"] and "file system" in error["hint"]
    # the ladder went on: stages that do not need environment still ran
    for stage in ("torch", "device", "compute", "memory"):
        assert status[stage] == "passed", stage
    assert outcomes(events)["pilot"].data["reason"] == "environment failed"
    assert finished(events)["first_error"]["stage"] == "environment"
