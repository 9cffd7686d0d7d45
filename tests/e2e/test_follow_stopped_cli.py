"""`preflight follow` on a run that someone else stops: who stopped it, when, and the command
to resume; the last frame is not "(running)" (issue 27)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_pilot_cli import preflight
from tests.e2e.test_stop_cli import start_held_pilot


def test_follow_says_who_stopped_the_run_when_and_how_to_resume(tmp_path: Path) -> None:
    root, run_dir, cli = start_held_pilot(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update({"PREFLIGHT_HOME": str(root), "COLUMNS": "200"})
    follower = subprocess.Popen([sys.executable, "-m", "bot", "follow", run_dir.name], cwd=root,
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, stdin=subprocess.DEVNULL)
    stopped = preflight(root, "stop", run_dir.name, "--reason", "wrong inputs folder",
                        "--by", "alice")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    out, err = follower.communicate(timeout=120)
    cli.communicate(timeout=120)
    assert follower.returncode == 1, out + err
    said = " ".join((out + err).split())
    assert "The run was stopped by alice at 20" in said and "wrong inputs folder" in said
    assert f"preflight resume {run_dir.name}" in said
    assert "(running)" not in out.split("Diagnostics and pilot")[-1]
