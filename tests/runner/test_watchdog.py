"""The watchdog worker: it dies with its parent, and a timeout kills its whole group."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import pytest

from runner.watchdog import Worker
from tests.processes import alive, wait_until
from tests.runner.test_stages_kit import start_hanging_runner, write_spec


def test_worker_dies_when_the_runner_is_killed(tmp_path: Path) -> None:
    proc, run_dir, worker_pid, grandchild = start_hanging_runner(tmp_path)
    try:
        assert alive(worker_pid)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        wait_until(lambda: not alive(worker_pid), "the worker to die with its parent", 30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    # The grandchild was started by the user's check; it is not ours to keep alive but
    # must not keep the run's files open forever: clean it up for the test machine.
    if alive(grandchild):
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
    assert not alive(worker_pid) and not alive(grandchild)
    assert not worker.alive
    # the next stage gets a new worker
    ok = worker.run_stage("prepare", facts, 60.0, lambda etype, **data: None)
    try:
        assert ok["status"] == "passed" and ok["facts"]["run_dir"] == str(tmp_path)
        assert worker.starts == 2
    finally:
        worker.stop()
    assert not worker.alive


def test_a_stage_judged_by_progress_fails_in_the_worker_once_it_stops_moving(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``idle`` (the collect stage's kind): the timeout counts from its last beat or event;
    a stage that never moves fails where it stopped, its worker killed."""
    monkeypatch.setenv("TINYCHECK_PIDFILE", str(tmp_path / "hang.pids"))
    spec = write_spec(tmp_path, diagnostics={"checks": ["tinycheck:hang"]})
    worker = Worker(str(spec), str(tmp_path), resume=False)
    try:
        result = worker.run_stage("extensions", {"device": {"device": "cpu"}}, 2.0,
                                  lambda etype, **data: None, idle=True)
    finally:
        worker.stop()
    assert result["status"] == "failed" and result["facts"] == {"stalled_at": "its start"}
    assert result["error"]["message"] == ("stage extensions made no progress for 2 s; it "
                                          "stopped at its start")
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
