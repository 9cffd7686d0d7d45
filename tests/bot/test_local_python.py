"""The local runner runs with the interpreter the manifest names (node.python)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.errors import DispatchError
from bot.manifest.load import load_manifest_file
from bot.nodes.local import LocalDispatcher
from bot.pilot.plan import make_plan
from tests.bot.fakes import write_manifest


def handle(tmp_path: Path, python: str | None) -> RunHandle:
    return RunHandle(run_id="r", run_dir=tmp_path, spec_path=tmp_path / "spec.json",
                     project_dir=tmp_path, node={"kind": "local", "python": python})


def test_node_python_is_used_and_a_missing_one_is_refused(tmp_path: Path) -> None:
    own = str(tmp_path / "preflight-own-python")
    dispatcher = LocalDispatcher(own, env={})
    named = tmp_path / "project-python"
    os.symlink(sys.executable, named)
    assert dispatcher.python_for(handle(tmp_path, str(named))) == str(named)
    with pytest.raises(DispatchError, match="node.python 'python-nope'"):
        dispatcher.python_for(handle(tmp_path, "python-nope"))
    assert dispatcher.python_for(handle(tmp_path, None)) == own  # unset: Preflight's own


def test_the_plan_says_when_the_local_runner_falls_back(tmp_path: Path) -> None:
    unset = make_plan(load_manifest_file(write_manifest(tmp_path)))
    assert any("node.python is not set" in n for n in unset.notes)
    named = make_plan(load_manifest_file(write_manifest(
        tmp_path, extra=f"node: {{kind: local, python: {sys.executable}}}")))
    assert not any("node.python" in n for n in named.notes)
