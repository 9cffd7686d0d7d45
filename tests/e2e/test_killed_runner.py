"""A runner killed with kill -9: `show` says it died (signal 9), the stage that ran is
interrupted, its last event and output are named, never None nor a library warning."""

from __future__ import annotations

import os
import signal
from pathlib import Path

from tests.e2e.test_pilot_cli import preflight
from tests.e2e.test_stop_cli import start_held_pilot


def test_kill_9_is_shown_as_a_death_during_the_pilot(tmp_path: Path) -> None:
    root, run_dir, cli = start_held_pilot(tmp_path)
    pid = int((run_dir / "runner.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 1, out + err
    shown = preflight(root, "show", "latest")
    text = " ".join(shown.stdout.split())
    assert "killed by signal 9 (SIGKILL) during stage pilot" in text
    assert "its last event: #" in text and "progress 2/8 items" in text
    assert "! pilot" in text and "the runner died during this stage" in text
    assert "… pilot" not in text  # not shown as still running
    assert "None" not in text and "Warning" not in text
