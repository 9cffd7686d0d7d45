"""The one rule of "a process is running" (bot/node_programs/launcher.py), which the
launcher's lock, the local dispatcher and the SSH probe share: gone or a zombie is not."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.node_programs import launcher as node_launcher
from bot.node_programs.launcher import running, stat_fields
from bot.nodes.local import LocalDispatcher
from tests.processes import wait_until


def test_a_command_name_with_a_parenthesis_is_read_past() -> None:
    line = b"42 (a) b) S 1 42 42 0 -1"
    assert stat_fields(line)[:2] == ["S", "1"]
    assert stat_fields("42 (x) Z 1") == ["Z", "1"]
    assert stat_fields("garbage") == []


def test_a_zombie_is_not_running_for_the_launcher_nor_the_local_dispatcher(
        tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])  # ends; not reaped: a zombie
    try:
        wait_until(lambda: running(proc.pid) is None, "the child a zombie", 30)
        handle = RunHandle(run_id="r", run_dir=tmp_path, spec_path=tmp_path / "spec.json",
                           project_dir=tmp_path, pid=proc.pid)
        assert LocalDispatcher(sys.executable, env={}).is_alive(handle) is False
    finally:
        proc.wait()
    assert running(proc.pid) is None  # reaped: gone
    fields = running(os.getpid())
    assert fields is not None and fields[0] in ("R", "S")


def test_a_process_in_state_x_is_not_running_either(monkeypatch: pytest.MonkeyPatch) -> None:
    """Dead (X), as the Ray group stops read it: a process seen at that instant has ended."""
    def stat_of(state: str) -> Callable[..., io.BytesIO]:
        return lambda path, mode="r": io.BytesIO(f"{os.getpid()} (python) {state} 1 2".encode())

    monkeypatch.setattr(node_launcher, "open", stat_of("X"), raising=False)
    assert running(os.getpid()) is None
    monkeypatch.setattr(node_launcher, "open", stat_of("D"), raising=False)
    assert running(os.getpid()) == ["D", "1", "2"]  # waiting on a disk: running


def test_the_shell_probe_of_a_node_without_proc(tmp_path: Path) -> None:
    """probe_command (a node where the SFTP probe finds no /proc): done, starting, alive
    (the pid answers kill -0) or dead."""
    from bot.node_programs import probe_command

    def probe(pid: int | None) -> str:
        return subprocess.run(["sh", "-c", probe_command(pid, str(tmp_path))],
                              capture_output=True, text=True, check=True).stdout.strip()

    assert probe(None) == "starting"
    assert probe(os.getpid()) == "alive"
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    ended.wait()
    assert probe(ended.pid) == "dead"
    (tmp_path / "runner.pid").write_text(f"{os.getpid()}\n")
    assert probe(None) == "alive"
    (tmp_path / "exit_code").write_text("0\n")
    assert probe(os.getpid()) == "done"
