"""A bug in the ladder itself still ends the run with run.finished naming it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.runner.test_stages_kit import REPO, runner_env, write_spec

# Injected through sitecustomize, the way a broken installation would break the runner.
BROKEN_LADDER = '''
import runner.ladder as ladder

def run(self):
    raise RuntimeError("ladder bug for the test")

ladder.Ladder.run = run
'''


def test_an_internal_error_still_writes_run_finished(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    inject = tmp_path / "inject"
    inject.mkdir()
    (inject / "sitecustomize.py").write_text(BROKEN_LADDER)
    run_dir = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "runner", str(spec), "--run-dir", str(run_dir)],
                          cwd=REPO, env=runner_env(inject), capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 1
    assert "ladder bug for the test" in done.stderr  # the traceback, for runner.log
    events = [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    assert [e["type"] for e in events] == ["run.started", "run.finished"]
    error = events[-1]["first_error"]
    assert (events[-1]["status"], error["stage"], error["type"]) == (
        "failed", "runner", "RuntimeError")
    assert "sitecustomize.py" in error["where"]
