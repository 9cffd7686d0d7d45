"""The results fetch as one stream per node over the real loopback sshd (issue 35, point 2):
the evidence copy only; a cut stream resumes without sending again what verifies; a shard
that differs from its SHA256SUMS line, a member over a cap, a link or a FIFO refuse the
fetch by name and replace nothing."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError, NodeUnreachable
from bot.node_programs.fetch_stream import HELD
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.nodes.ssh.fetch import FetchLimits
from bot.service.forecast_inputs import pilot_transfers
from runner.evidence import copy_evidence
from tests.remote.sshd_server import Sshd
from tests.runner.test_evidence_shards import make_run

T = TypeVar("T")
RUN = "r1"


class TappedSSH(SSHDispatcher):
    """Counts the bytes of each fetch stream; ``cut_after``: the connections are killed
    once a stream has brought that many bytes, and the next read fails as a dropped
    connection's does."""

    sshd: Sshd
    streams: list[int]
    cut_after: int | None = None

    async def guarded(self, node: SSHNode,
                      work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        return await super().guarded(node, lambda conn: work(_Conn(conn, self)))


class _Conn:
    def __init__(self, conn: Any, owner: TappedSSH) -> None:
        self.conn, self.owner = conn, owner

    async def create_process(self, command: str, **kw: Any) -> Any:
        proc = await self.conn.create_process(command, **kw)
        if HELD not in command:
            return proc
        self.owner.streams.append(0)
        return _Proc(proc, self.owner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


class _Proc:
    def __init__(self, proc: Any, owner: TappedSSH) -> None:
        self.proc, self.stdout = proc, _Out(proc.stdout, owner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.proc, name)


class _Out:
    def __init__(self, inner: Any, owner: TappedSSH) -> None:
        self.inner, self.owner = inner, owner

    async def read(self, n: int) -> bytes:
        owner = self.owner
        if owner.cut_after is not None and owner.streams[-1] >= owner.cut_after:
            owner.cut_after = None
            assert owner.sshd.kill_connections() >= 1
            # what the client had buffered already is lost with its connection too
            raise ConnectionResetError("the connection dropped mid-stream")
        data = bytes(await self.inner.read(min(n, 16 << 10)))  # fine steps to cut at
        owner.streams[-1] += len(data)
        return data


def tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture
def setup(tmp_path: Path, sshd: Sshd) -> Any:
    """A node holding a finished run (outputs in its run directory) and its evidence copy
    in shards; the bot's run directory naming both; a tapped dispatcher."""
    node_run = make_run(tmp_path / "src", 60)
    runs = tmp_path / "node" / "runs"
    runs.mkdir(parents=True)
    shutil.move(str(node_run), runs / RUN)
    remote = tmp_path / "node" / "evidence" / "tag"
    report = copy_evidence(str(runs / RUN), str(remote / RUN), plain_max=10, shard_files=10)
    assert report.verified and report.shards == 6, report.problems
    run_dir = tmp_path / "bot" / RUN
    run_dir.mkdir(parents=True)
    (run_dir / "remote.json").write_text(json.dumps(
        {"node": sshd.node(tmp_path / "node"), "run_dir": str(runs / RUN), "pid": None,
         "evidence": {"local": str(tmp_path / "evidence"), "remote": str(remote)}}))
    d = sshd.dispatcher(TappedSSH, attempts=1)
    assert isinstance(d, TappedSSH)
    d.sshd, d.streams = sshd, []
    try:
        yield d, RunHandle(RUN, run_dir, run_dir / "spec.json", tmp_path), remote / RUN
    finally:
        d.close()


def test_a_fetch_brings_the_evidence_copy_only_in_one_stream(setup: Any) -> None:
    d, handle, node_copy = setup
    home = d.fetch_results(handle)
    assert home is not None and tree(home) == tree(node_copy)
    assert len(d.streams) == 1
    # the stream is the copy (tar headers aside), not the run directory's outputs too
    copy_bytes = sum(p.stat().st_size for p in node_copy.rglob("*") if p.is_file())
    assert copy_bytes <= d.streams[0] < copy_bytes + 64 * 1024
    assert not (handle.run_dir / "outputs").exists()
    assert sorted(p.name for p in handle.run_dir.iterdir()) == [
        "balance.csv", "balance.json", "evidence-fetch.json", "remote.json"]
    # the balance the thread uploads: the verified copy's own file, linked
    assert (handle.run_dir / "balance.csv").stat().st_ino == (home / "balance.csv").stat().st_ino
    assert not any(p.name.startswith(".fetch") for p in home.parent.iterdir())
    # what the stream carried, in remote.json: the forecast's fetch rate (issue 36)
    files = sum(1 for p in node_copy.rglob("*") if p.is_file())
    fetched = json.loads((handle.run_dir / "remote.json").read_text())["fetched"]
    assert (fetched["files"], fetched["bytes"]) == (files, copy_bytes)
    _sent, measured = pilot_transfers(handle.run_dir)
    assert measured is not None and measured[0] > 0 and measured[1:] == (files, copy_bytes)


def test_a_cut_stream_resumes_and_does_not_send_what_verifies_again(setup: Any) -> None:
    d, handle, node_copy = setup
    total = sum(p.stat().st_size for p in node_copy.rglob("*") if p.is_file())
    d.cut_after = total // 2
    with pytest.raises(NodeUnreachable, match="what arrived is kept for the next fetch"):
        d.fetch_results(handle)
    staging = handle.run_dir.parent.parent / "evidence" / f".fetch-{RUN}" / RUN
    kept = tree(staging)
    assert kept and not (staging.parent.parent / RUN).exists()  # nothing replaced yet
    d.backoff.clear()
    home = d.fetch_results(handle)
    assert home is not None and tree(home) == tree(node_copy)
    # the second stream left out every whole file the first brought (SHA256SUMS aside)
    resent = d.streams[1]
    held = sum((node_copy / rel).stat().st_size for rel in kept
               if rel != "SHA256SUMS" and tree(node_copy).get(rel) == kept[rel])
    assert held >= total // 3
    assert resent <= total - held + 64 * 1024, (resent, total, held)
    # the measure is the complete try's: the files it sent, not those the cut one left
    fetched = json.loads((handle.run_dir / "remote.json").read_text())["fetched"]
    assert fetched["bytes"] <= total - held and fetched["files"] < len(tree(node_copy))


def test_a_shard_that_differs_from_its_line_is_refused_by_name(setup: Any) -> None:
    d, handle, node_copy = setup
    home = d.fetch_results(handle)
    before = tree(home)
    shard = node_copy / "shards" / "outputs-000003.tar"
    data = bytearray(shard.read_bytes())
    data[600] ^= 0xFF
    shard.write_bytes(bytes(data))
    with pytest.raises(DispatchError) as refused:
        d.fetch_results(handle)
    assert "'shards/outputs-000003.tar'" in str(refused.value)
    assert "SHA256SUMS" in str(refused.value) and "nothing was replaced" in str(refused.value)
    assert tree(home) == before
    assert not any(p.name.startswith(".fetch") for p in home.parent.iterdir())


def test_a_member_over_a_cap_is_stopped_at_its_header_and_named(setup: Any) -> None:
    d, handle, node_copy = setup
    biggest = max((node_copy / "shards").iterdir(), key=lambda p: p.stat().st_size)
    d.fetch_limits = FetchLimits(file_bytes=biggest.stat().st_size - 1)
    with pytest.raises(DispatchError) as over:
        d.fetch_results(handle)
    assert f"'shards/{biggest.name}'" in str(over.value)
    assert "PREFLIGHT_FETCH_MAX_FILE_BYTES" in str(over.value)
    files = sum(1 for p in node_copy.rglob("*") if p.is_file())
    d.fetch_limits = FetchLimits(files=files - 1)
    with pytest.raises(DispatchError, match=f"file {files} of the fetch, over the cap of "
                                            f"{files - 1} files"):
        d.fetch_results(handle)
    home = handle.run_dir.parent.parent / "evidence"
    assert sorted(p.name for p in home.iterdir()) == []  # nothing placed, no staging left
    d.fetch_limits = FetchLimits()
    assert d.fetch_results(handle) is not None


def test_a_volume_past_its_own_sized_cap_is_stopped_and_an_explicit_fetch_uses_the_ceiling(
        setup: Any) -> None:
    from dataclasses import replace

    d, handle, node_copy = setup
    total = sum(p.stat().st_size for p in node_copy.rglob("*") if p.is_file())
    handle.spec_path.write_text(json.dumps(  # the cap the bot sized from its pilot
        {"inputs": {"expected_count": 60}, "results": {"fetch_max_bytes": total // 2}}))
    with pytest.raises(DispatchError) as over:
        d.fetch_results(handle)
    said = str(over.value)
    assert "larger than its pilot foretold" in said
    assert f"over this run's cap of {total // 2} bytes" in said
    assert "`preflight fetch RUN` brings it back" in said
    assert sorted((handle.run_dir.parent.parent / "evidence").iterdir()) == []
    home = d.fetch_results(replace(handle, ceiling=True))  # a person asked: the ceiling
    assert home is not None and tree(home) == tree(node_copy)


@pytest.mark.parametrize("make,what", [
    (lambda p: p.symlink_to("/etc/hostname"), "a symbolic link (to '/etc/hostname')"),
    (os.mkfifo, "a FIFO")])
def test_a_link_or_a_fifo_in_the_copy_is_refused_by_name(setup: Any, make: Any,
                                                          what: str) -> None:
    d, handle, node_copy = setup
    make(node_copy / "shards" / "zz")
    with pytest.raises(DispatchError) as refused:
        d.fetch_results(handle)
    assert f"{RUN}/shards/zz', which is {what}" in str(refused.value)
    assert sorted((handle.run_dir.parent.parent / "evidence").iterdir()) == []
