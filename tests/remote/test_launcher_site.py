"""The launcher runs with the node's interpreter but without its ``site`` (``python -S``):
it needs the standard library only, a site's ``.pth`` files and ``sitecustomize`` cost
every dispatch their import, and one that prints would garble the launcher's answers.
The runner itself still starts with the node's full interpreter, site included."""

from __future__ import annotations

import stat
from pathlib import Path

from tests.remote.remote_kit import provisioned_bot, start_run, write_project
from tests.remote.sshd_server import BARE_PYTHON, Sshd


def test_a_site_hook_that_prints_does_not_touch_the_launcher(tmp_path: Path,
                                                             sshd: Sshd) -> None:
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "sitecustomize.py").write_text("print('conda says hello')\n")
    python = tmp_path / "python-with-hooks"  # the node's python, its site printing
    python.write_text(f"#!/bin/sh\nPYTHONPATH={hooks}${{PYTHONPATH:+:$PYTHONPATH}} "
                      f"exec {BARE_PYTHON} \"$@\"\n")
    python.chmod(python.stat().st_mode | stat.S_IXUSR)
    manifest = write_project(tmp_path / "project", {**sshd.node(tmp_path / "node"),
                                                    "python": str(python)})
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["outcome"] == "passed", run.get("first_error")
    log = (tmp_path / "node" / "runs" / run_id / "runner.log").read_text()
    assert "conda says hello" in log  # the runner's own interpreter has its site
