"""What a dispatcher reads from a runner's events.jsonl, and what it says when a line is
not an event."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.local import LocalDispatcher
from bot.errors import DispatchError
from runner.events import EventFormatError


def test_a_line_that_is_no_event_is_a_dispatch_error_naming_the_run(tmp_path: Path) -> None:
    """The runner's EventFormatError is translated where it is read (dispatch/): the bot's
    own error names the run, the file and what to do."""
    good = '{"seq": 1, "type": "run.started", "run": "r7", "ts": "t"}\n'
    (tmp_path / "events.jsonl").write_text(good + "not an event\n", encoding="utf-8")
    handle = RunHandle(run_id="r7", run_dir=tmp_path, spec_path=tmp_path / "spec.json",
                       project_dir=tmp_path)
    with pytest.raises(DispatchError, match=r"run r7: .*events\.jsonl.*not JSON") as caught:
        LocalDispatcher(sys.executable, env={}).read_events(handle, 0)
    assert isinstance(caught.value.__cause__, EventFormatError)
    assert "preflight stop r7" in str(caught.value)
