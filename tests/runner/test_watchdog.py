"""The watchdog worker: it dies with its parent, and a timeout kills its whole group."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.watchdog import Worker
from tests.runner.test_stages_kit import REPO, runner_env, write_spec


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


def _wait_until(condition, what: str, deadline_s: float = 60.0) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline, not waiting for time


def test_worker_dies_when_the_runner_is_killed(tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pids"
    spec = write_spec(tmp_path, diagnostics={"checks": ["tinycheck:hang"]})
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-m", "runner", str(spec), "--run-dir", str(run_dir)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=REPO,
        env=runner_env(TINYCHECK_PIDFILE=str(pidfile)))
    try:
        _wait_until(pidfile.exists, "the hanging check to start")
        worker_pid, grandchild = (int(p) for p in pidfile.read_text().split())
        assert _alive(worker_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        _wait_until(lambda: not _alive(worker_pid), "the worker to die with its parent", 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The grandchild was started by the user's check; it is not ours to keep alive but
    # must not keep the run's files open forever: clean it up for the test machine.
    if _alive(grandchild):
        os.kill(grandchild, signal.SIGKILL)
    lines = (run_dir / "events.jsonl").read_text().splitlines()
    assert json.loads(lines[-1])["type"] == "stage.started"  # died mid-stage, file intact


def test_timeout_kills_the_worker_group_and_a_fresh_worker_runs_on(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pidfile = tmp_path / "hang.pids"
    monkeypatch.setenv("TINYCHECK_PIDFILE", str(pidfile))  # inherited by the worker
    spec = write_spec(tmp_path, diagnostics={"checks": ["tinycheck:hang"]})
    worker = Worker(str(spec), str(tmp_path), resume=False)
    facts = {"device": {"device": "cpu"}}
    result = worker.run_stage("extensions", facts, 2.0, lambda etype, **data: None)
    assert result["status"] == "failed"
    assert result["error"]["message"] == "stage extensions timed out after 2 s"
    worker_pid, grandchild = (int(p) for p in pidfile.read_text().split())
    assert not _alive(worker_pid) and not _alive(grandchild)
    assert not worker.alive
    # the next stage gets a new worker
    ok = worker.run_stage("prepare", facts, 60.0, lambda etype, **data: None)
    try:
        assert ok["status"] == "passed" and ok["facts"]["run_dir"] == str(tmp_path)
        assert worker.starts == 2
    finally:
        worker.stop()
    assert not worker.alive


def test_worker_crash_is_a_failed_stage(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "crasher.py").write_text("import os\n\ndef die():\n    os._exit(7)\n")
    spec = write_spec(tmp_path, diagnostics={"checks": ["crasher:die"]})
    worker = Worker(str(spec), str(tmp_path), resume=False)
    try:
        result = worker.run_stage("extensions", {"device": {"device": "cpu"}}, 60.0,
                                  lambda etype, **data: None)
    finally:
        worker.stop()
    assert result["status"] == "failed"
    assert result["error"]["type"] == "WorkerDied"
    assert "exited with code 7" in result["error"]["message"]
