"""``NodeDispatcher``'s follower over a kind's ``Node`` (the SSH kind's too, since issue 33
round three): a stop that cannot reach the node says nothing was stopped and the runner
may still be running; the log tail is the node's own read of a file's tail where it has
one (``TailReader``, the SSH adapter's SFTP read), else ``tail -c`` run there, and "" while
the node cannot be reached. Fake nodes, no process."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.node_dispatcher import NodeDispatcher
from bot.errors import NodeUnreachable
from bot.nodes.base import Node, TailReader

RUN_DIR = "/node/runs/r-1"


class ShellNode:
    """A node that answers ``run`` from ``answers`` (a command's first word → its reply)
    and records every command; ``down``: every call raises ``NodeUnreachable``."""

    where = "fake gpu-1"
    host = "gpu-1"
    python = "python3"
    workdir = "/node"
    ray_port = None

    def __init__(self, down: bool = False) -> None:
        self.down = down
        self.ran: list[str] = []

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
            cap: int | None = None) -> tuple[int, str, str]:
        if self.down:
            raise NodeUnreachable(f"{self.where}: connection timed out")
        self.ran.append(command)
        return 0, "the shell's tail\n", ""

    def send_archive(self, command: str, stream: bytes, timeout: float = 900.0) -> str:
        raise AssertionError("the follower sends nothing")

    def read_file(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        raise FileNotFoundError(path)

    def probe(self, pid: int | None, run_dir: str) -> str:
        return "alive"

    def stop(self, pid: int | None, run_dir: str) -> None:
        self.run(f"stop {pid} {run_dir}")


class TailNode(ShellNode):
    """A node that reads a file's tail itself (as the SSH adapter does over SFTP)."""

    def __init__(self, down: bool = False) -> None:
        super().__init__(down)
        self.tails: list[tuple[str, int]] = []

    def read_tail(self, path: str, limit: int) -> bytes:
        if self.down:
            raise NodeUnreachable(f"{self.where}: connection timed out")
        self.tails.append((path, limit))
        return "the node's tail: é\n".encode()[-limit:]


class _On(NodeDispatcher):
    """The follower with its run located on ``node`` (``remote.json`` is in the run dir)."""

    def __init__(self, node: ShellNode) -> None:
        super().__init__(lambda spec: node)
        self.node = node

    def _located(self, handle: RunHandle) -> tuple[Node, dict[str, Any]]:
        return self.node, json.loads((handle.run_dir / "remote.json").read_text())


def _handle(tmp_path: Path) -> RunHandle:
    (tmp_path / "remote.json").write_text(json.dumps({"run_dir": RUN_DIR, "pid": 4242}))
    return RunHandle("r-1", tmp_path, tmp_path / "spec.json", tmp_path)


def test_a_stop_that_cannot_reach_the_node_says_the_runner_may_still_run(
        tmp_path: Path) -> None:
    with pytest.raises(NodeUnreachable, match=r"cannot stop run r-1: fake gpu-1: connection "
                                              r"timed out; its runner may still be running, "
                                              r"try again"):
        _On(ShellNode(down=True)).stop(_handle(tmp_path))


def test_a_stop_reaches_the_runner_by_its_pid(tmp_path: Path) -> None:
    node = ShellNode()
    _On(node).stop(_handle(tmp_path))
    assert node.ran == [f"stop 4242 {RUN_DIR}"]


def test_the_log_tail_is_the_nodes_own_read_where_it_has_one(tmp_path: Path) -> None:
    node = TailNode()
    assert isinstance(node, TailReader) and not isinstance(ShellNode(), TailReader)
    assert _On(node).log_tail(_handle(tmp_path), limit=64) == "the node's tail: é\n"
    assert node.tails == [(f"{RUN_DIR}/runner.log", 64)] and node.ran == []  # no shell


def test_the_log_tail_is_tail_run_on_a_node_without_its_own_read(tmp_path: Path) -> None:
    node = ShellNode()
    assert _On(node).log_tail(_handle(tmp_path), limit=64) == "the shell's tail\n"
    assert node.ran == [f"tail -c 64 {RUN_DIR}/runner.log"]


@pytest.mark.parametrize("node", [TailNode(down=True), ShellNode(down=True)])
def test_the_log_tail_is_empty_while_the_node_cannot_be_reached(tmp_path: Path,
                                                                node: ShellNode) -> None:
    assert _On(node).log_tail(_handle(tmp_path)) == ""


def test_closing_the_ssh_sessions_ends_a_call_another_thread_waits_on() -> None:
    """A run's end fetching its results on the bot's run-end thread, while the bot stops and
    closes its sessions: the fetch hears NodeUnreachable at once instead of waiting on a
    stopped loop for ever (the process then never exited)."""
    import asyncio
    import threading
    import time

    from bot.nodes.ssh.session import SSHSessions

    sessions = SSHSessions(use_agent=False)
    heard: list[BaseException] = []
    started = threading.Event()

    async def transfer() -> None:  # a fetch that has not finished
        started.set()
        await asyncio.sleep(3600)

    def fetch() -> None:
        try:
            sessions._call(transfer(), None)
        except BaseException as exc:  # noqa: BLE001 - what the caller hears
            heard.append(exc)

    waiting = threading.Thread(target=fetch, daemon=True)
    waiting.start()
    assert started.wait(10)
    began = time.monotonic()
    sessions.close()
    waiting.join(10)
    assert not waiting.is_alive() and time.monotonic() - began < 10
    assert len(heard) == 1 and isinstance(heard[0], NodeUnreachable)
    assert "sessions were closed" in str(heard[0])
