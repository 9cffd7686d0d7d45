"""A fetched file's bytes over the real sshd's SFTP: the reads a file needs are sized by
what the node says it holds (one read for a small file, at most ``IN_FLIGHT`` at once),
and a file is read on to its end whatever its size: empty, exactly a block, more blocks
than are read at once, or grown since it was looked at."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.upload import SSHNode
from bot.nodes.ssh.fetch import BLOCK, IN_FLIGHT, FetchLimits, _Budget, _get_file
from tests.remote.sshd_server import Sshd

SIZES = [0, 1, BLOCK - 1, BLOCK, BLOCK + 1, IN_FLIGHT * BLOCK, IN_FLIGHT * BLOCK + 7,
         (IN_FLIGHT + 3) * BLOCK]


class CountingFile:
    """An SFTP file handle that counts the reads asked of it."""

    def __init__(self, opening: Any, reads: list[int]) -> None:
        self.opening, self.reads, self.fh = opening, reads, None  # type: Any, list[int], Any

    async def __aenter__(self) -> CountingFile:
        self.fh = await self.opening.__aenter__()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.opening.__aexit__(*exc)

    async def stat(self) -> Any:
        return await self.fh.stat()

    async def read(self, size: int, offset: int) -> bytes:
        self.reads.append(offset)
        return bytes(await self.fh.read(size, offset))


class CountingSFTP:
    def __init__(self, inner: Any) -> None:
        self.inner, self.reads = inner, []  # type: tuple[Any, list[int]]

    def open(self, path: str, mode: str) -> CountingFile:
        return CountingFile(self.inner.open(path, mode), self.reads)


def fetch(sshd: Sshd, src: Path, dst: Path, size: int | None = None) -> list[int]:
    """``src`` fetched to ``dst`` over SFTP; the offsets of the reads asked."""
    dispatcher = sshd.dispatcher()
    node = SSHNode.from_dict(sshd.node(src.parent))

    async def work(conn: Any) -> list[int]:
        sftp = CountingSFTP(await dispatcher.sftp_of(conn))
        budget = _Budget("r1", node.where, FetchLimits())
        budget.check("x", src.stat().st_size if size is None else size)
        fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            await _get_file(sftp, str(src), fd, "x", budget)
        finally:
            os.close(fd)
        return sftp.reads

    try:
        return dispatcher._call(dispatcher.guarded(node, work), 60)
    finally:
        dispatcher.close()


@pytest.mark.parametrize("size", SIZES)
def test_a_file_comes_back_whole_whatever_its_size(sshd: Sshd, tmp_path: Path,
                                                   size: int) -> None:
    src = tmp_path / "node" / "out.bin"
    src.parent.mkdir()
    src.write_bytes(os.urandom(size))
    reads = fetch(sshd, src, tmp_path / "got.bin")
    assert (tmp_path / "got.bin").read_bytes() == src.read_bytes()
    assert len(reads) == len(set(reads))  # no block read twice
    if size < BLOCK:
        assert reads == [0]  # one read: not IN_FLIGHT reads past the end


def test_a_file_that_grew_since_the_node_listed_it_is_read_to_its_end(
        sshd: Sshd, tmp_path: Path) -> None:
    src = tmp_path / "node" / "log.txt"
    src.parent.mkdir()
    src.write_bytes(b"z" * (3 * BLOCK + 11))
    # the size the node gave when it listed the folder: before the file grew
    reads = fetch(sshd, src, tmp_path / "got.txt", size=10)
    assert (tmp_path / "got.txt").read_bytes() == src.read_bytes()
    assert len(reads) == len(set(reads))


def test_the_reads_in_flight_are_at_most_in_flight(sshd: Sshd, tmp_path: Path) -> None:
    src = tmp_path / "node" / "big.bin"
    src.parent.mkdir()
    src.write_bytes(b"q" * ((2 * IN_FLIGHT + 1) * BLOCK))
    reads = fetch(sshd, src, tmp_path / "got.bin")
    assert reads[:IN_FLIGHT] == [i * BLOCK for i in range(IN_FLIGHT)]
    assert (tmp_path / "got.bin").read_bytes() == src.read_bytes()


