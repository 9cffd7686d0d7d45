"""What a dispatcher reads from a runner's events.jsonl, and what it says when a line is
not an event."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from bot.nodes.local import LocalDispatcher
from bot.nodes.ssh.dispatcher import SSHDispatcher
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


class _NodeEvents(SSHDispatcher):
    """The SSH dispatcher's read of events.jsonl, the node's bytes given (no SSH)."""

    def __init__(self, chunk: bytes) -> None:
        super().__init__()
        self.chunk = chunk
        self.reads: list[tuple[int, int]] = []

    async def _read(self, node: SSHNode, path: str, offset: int, size: int = 4 << 20) -> bytes:
        self.reads.append((offset, size))
        return self.chunk[offset:offset + size]


def test_a_node_line_that_is_no_event_is_a_dispatch_error_naming_run_file_and_node(
        tmp_path: Path) -> None:
    good = b'{"seq": 1, "type": "run.started", "run": "r7", "ts": "t"}\n'
    node = {"kind": "ssh", "host": "gpu-a", "workdir": "/w"}
    (tmp_path / "remote.json").write_text(json.dumps({"node": node, "run_dir": "/w/runs/r7"}))
    handle = RunHandle(run_id="r7", run_dir=tmp_path, spec_path=tmp_path / "spec.json",
                       project_dir=tmp_path)
    dispatcher = _NodeEvents(good + b"not an event\n")
    try:
        with pytest.raises(DispatchError, match=r"run r7: /w/runs/r7/events\.jsonl on gpu-a:22 "
                                                r"has a line that is not an event") as caught:
            dispatcher.read_events(handle, 0)
        assert isinstance(caught.value.__cause__, EventFormatError)
        assert "preflight stop r7" in str(caught.value)
        assert not (tmp_path / "events.jsonl").exists()  # nothing of the chunk mirrored
    finally:
        dispatcher.close()


def _line(seq: int, **data: object) -> bytes:
    return (json.dumps({"seq": seq, "type": "note", "run": "r7", "ts": "t", **data})
            + "\n").encode()


def test_a_node_line_over_the_4_mib_window_is_read_with_the_events_after_it(
        tmp_path: Path) -> None:
    """A 5 MiB line (an event with a long list) grows the reader's window: it is read, the
    events after it too, and the local copy is the node's file; before, the follower got
    nothing from that offset on and the run was recorded as died."""
    node = {"kind": "ssh", "host": "gpu-a", "workdir": "/w"}
    (tmp_path / "remote.json").write_text(json.dumps({"node": node, "run_dir": "/w/runs/r7"}))
    handle = RunHandle(run_id="r7", run_dir=tmp_path, spec_path=tmp_path / "spec.json",
                       project_dir=tmp_path)
    data = _line(1) + _line(2, big="x" * (5 << 20)) + _line(3) + _line(4)
    dispatcher = _NodeEvents(data)
    try:
        events, offset = dispatcher.read_events(handle, 0)
        assert [e.seq for e in events] == [1]  # the first window holds only seq 1 whole
        events, offset = dispatcher.read_events(handle, offset)
        assert [e.seq for e in events] == [2, 3, 4]
        assert len(events[0].data["big"]) == 5 << 20
        assert offset == len(data)
        assert (tmp_path / "events.jsonl").read_bytes() == data
        assert max(size for _, size in dispatcher.reads) == 8 << 20
    finally:
        dispatcher.close()
