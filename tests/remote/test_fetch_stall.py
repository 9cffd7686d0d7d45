"""A results fetch that stops moving fails after the stall limit, naming the node, the
phase and the bytes (bot/nodes/ssh/transfer.py), over a real loopback sshd whose fetch
program (bot/node_programs/fetch_stream.py) is stopped (SIGSTOP) as its stream starts; no
wall limit waits, and the next fetch does not reuse the stuck connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import SSHNode
from bot.errors import NodeUnreachable
from bot.node_programs.fetch_stream import HELD
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.nodes.ssh.transfer import TransferLimits
from tests.processes import live_processes
from tests.remote.sshd_server import Sshd

T = TypeVar("T")


def _fetch_programs(sshd: Sshd) -> set[int]:
    """The fetch programs this test's sshd started (its descendants: never another test's)."""
    procs = list(live_processes())
    parent = {}
    for p in procs:
        try:
            with open(f"/proc/{p.pid}/stat", encoding="ascii") as fh:
                parent[p.pid] = int(fh.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue

    def ours(pid: int) -> bool:
        while pid > 1:
            if pid == sshd.proc.pid:
                return True
            pid = parent.get(pid, 0)
        return False

    return {p.pid for p in procs if HELD.encode() in p.cmdline and ours(p.pid)}


class StoppingFetch(SSHDispatcher):
    """Its first fetch stream's program on the node is stopped as soon as it runs."""

    sshd: Sshd
    stopped: list[int]

    async def guarded(self, node: SSHNode,
                      work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        return await super().guarded(node, lambda conn: work(_StopOnStart(conn, self)))


class _StopOnStart:
    def __init__(self, conn: Any, d: StoppingFetch) -> None:
        self.conn, self.d = conn, d

    async def create_process(self, command: str, **kw: Any) -> Any:
        proc = await self.conn.create_process(command, **kw)
        if HELD in command and not self.d.stopped:
            deadline = time.monotonic() + 10
            while not self.d.stopped and time.monotonic() < deadline:
                for pid in _fetch_programs(self.d.sshd):
                    os.kill(pid, signal.SIGSTOP)
                    self.d.stopped.append(pid)
                await asyncio.sleep(0.01)
            assert self.d.stopped, "no fetch program found on the node"
        return proc

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def test_a_results_fetch_that_stalls_fails_naming_the_node_and_the_bytes(
        sshd: Sshd, tmp_path: Path) -> None:
    remote = tmp_path / "node" / "runs" / "r1"
    remote.mkdir(parents=True)
    (remote / "events.jsonl").write_text("")
    (remote / "big.bin").write_bytes(b"\x01" * (40 << 20))
    run_dir = tmp_path / "bot" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "remote.json").write_text(json.dumps(
        {"node": sshd.node(tmp_path / "node"), "run_dir": str(remote), "pid": None,
         "evidence": {}}))
    d = sshd.dispatcher(StoppingFetch, transfer_limits=TransferLimits(stall_s=1.0))
    assert isinstance(d, StoppingFetch)
    d.sshd, d.stopped = sshd, []
    handle = RunHandle("r1", run_dir, run_dir / "spec.json", tmp_path)
    try:
        with pytest.raises(NodeUnreachable) as stalled:
            d.fetch_results(handle)
        # nothing placed; the staging folder kept for the next try (it resumes)
        assert not (run_dir / "big.bin").exists() and (run_dir / ".fetch").is_dir()
        # its connection was dropped: the next fetch gets a fresh session (the stopped
        # program still hangs) and brings the results back
        d.backoff.clear()
        assert d.fetch_results(handle) is None
        assert (run_dir / "big.bin").stat().st_size == 40 << 20
    finally:
        for pid in d.stopped:  # gone already if its session was closed meanwhile
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        d.close()
    assert str(stalled.value).startswith(
        f"{sshd.user}@127.0.0.1:{sshd.port}: the results fetch stalled: no byte moved for "
        ), stalled.value
    assert " moved; the stall limit is 1 s" in str(stalled.value), stalled.value
