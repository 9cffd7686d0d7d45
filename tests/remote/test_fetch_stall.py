"""A results fetch that stops moving fails after the stall limit, naming the node, the
phase and the bytes (bot/nodes/ssh/transfer.py), over a real loopback sshd whose SFTP
server is stopped (SIGSTOP) as the fetch opens the run's large file; no wall limit waits,
and the next fetch does not reuse the stuck connection."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.errors import NodeUnreachable
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.nodes.ssh.transfer import TransferLimits
from tests.processes import live_processes
from tests.remote.sshd_server import Sshd


def _sftp_servers(sshd: Sshd) -> set[int]:
    """The SFTP servers this test's sshd started (its descendants: never another test's)."""
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

    return {p.pid for p in procs if p.cmdline.split(b"\0")[0].endswith(b"sftp-server")
            and ours(p.pid)}


class _StopOnOpen:
    """The dispatcher's SFTP client; opening ``name`` first stops the node's SFTP server."""

    def __init__(self, inner: Any, name: str, d: StoppingFetch) -> None:
        self.inner, self.name, self.d = inner, name, d
        self.stopped = d.stopped

    def open(self, path: str, mode: str) -> Any:
        if path.endswith("/" + self.name) and not self.stopped:
            for pid in _sftp_servers(self.d.sshd) - self.d.before:  # this connection's
                os.kill(pid, signal.SIGSTOP)
                self.stopped.append(pid)
            assert self.stopped, "no SFTP server found for the fetch"
        return self.inner.open(path, mode)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class StoppingFetch(SSHDispatcher):
    sshd: Sshd
    stopped: list[int]
    before: set[int]

    async def sftp_of(self, conn: Any) -> Any:
        return _StopOnOpen(await super().sftp_of(conn), "big.bin", self)


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
    d.sshd, d.stopped, d.before = sshd, [], _sftp_servers(sshd)
    handle = RunHandle("r1", run_dir, run_dir / "spec.json", tmp_path)
    try:
        with pytest.raises(NodeUnreachable) as stalled:
            d.fetch_results(handle)
        assert not (run_dir / "big.bin").exists() and not (run_dir / ".fetch").exists()
        # its connection was dropped: the next fetch gets a fresh SFTP server (the stopped
        # one still hangs) and brings the results back
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
    assert "(0 bytes of 40.0 MiB moved; the stall limit is 1 s" in str(stalled.value)
