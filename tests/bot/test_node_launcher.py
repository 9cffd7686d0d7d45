"""The one rule of "a process is running" (bot/dispatch/node_launcher.py), which the
launcher's lock, the local dispatcher and the SSH probe share: gone or a zombie is not."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from bot.dispatch.base import RunHandle
from bot.dispatch.local import LocalDispatcher
from bot.dispatch.node_launcher import running, stat_fields
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
