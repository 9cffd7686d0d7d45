"""The fetch's tar stream reader (bot/nodes/ssh/tar_reader.py) on streams written by the
node's program (bot/node_programs/fetch_stream.py): every size comes back whole whatever
the chunks it arrives in; long names, links and the HELD mark read; a stream that ends
early or holds no tar header is an error, never a short file."""

from __future__ import annotations

import asyncio
import io
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from bot.node_programs import FETCH_STREAM
from bot.nodes.ssh.tar_reader import RECORD, Member, TarReader, TarStreamError

SIZES = [0, 1, RECORD - 1, RECORD, RECORD + 1, (1 << 20) - 1, (1 << 20) + 3]


def stream(root: Path, held: str = "") -> bytes:
    return subprocess.run([sys.executable, "-S", "-c", FETCH_STREAM, str(root)],
                          input=held.encode(), capture_output=True, check=True).stdout


def read_all(data: bytes, chunk: int) -> list[tuple[Member, bytes]]:
    source = io.BytesIO(data)

    async def read(n: int) -> bytes:
        return source.read(min(n, chunk))

    async def main() -> list[tuple[Member, bytes]]:
        reader, out = TarReader(read), []
        while (member := await reader.next()) is not None:
            body = b"".join([piece async for piece in reader.chunks(member)])
            out.append((member, body))
        return out

    return asyncio.run(main())


@pytest.mark.parametrize("chunk", [1000, 1 << 16])
def test_every_size_and_a_long_name_come_back_whole(tmp_path: Path, chunk: int) -> None:
    root = tmp_path / "root"
    (root / ("d" * 120)).mkdir(parents=True)
    files = {f"{'d' * 120}/{'n' * 150}-{size}": os.urandom(size) for size in SIZES}
    for rel, data in files.items():
        (root / rel).write_bytes(data)
    (root / "SHA256SUMS").write_text("")
    (root / "link").symlink_to("/etc/hostname")
    got = read_all(stream(root), chunk)
    assert got[0][0].name == "SHA256SUMS"  # first, before the rest
    bodies = {m.name: body for m, body in got if m.is_file}
    assert {k: v for k, v in bodies.items() if k != "SHA256SUMS"} == files
    [link] = [m for m, _ in got if m.type == tarfile.SYMTYPE]
    assert link.name == "link" and link.linkname == "/etc/hostname"


def test_a_file_the_bot_holds_comes_as_a_marked_empty_member(tmp_path: Path) -> None:
    import hashlib

    root = tmp_path / "root"
    root.mkdir()
    (root / "a.bin").write_bytes(b"a" * 5000)
    (root / "b.bin").write_bytes(b"b" * 5000)
    digest = hashlib.sha256(b"a" * 5000).hexdigest()
    held = f"{digest}  a.bin\n{'0' * 64}  b.bin\n"  # b.bin held with a stale digest
    got = {m.name: (m, body) for m, body in read_all(stream(root, held), 4096)}
    assert got["a.bin"][0].held == digest and got["a.bin"][1] == b""
    assert got["b.bin"][0].held is None and got["b.bin"][1] == b"b" * 5000


def test_a_stream_cut_or_not_a_tar_is_an_error(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    (root / "a.bin").write_bytes(os.urandom(5000))
    data = stream(root)
    for broken in (data[:3000], data[:RECORD * 2], b"x" * RECORD):
        with pytest.raises(TarStreamError):
            read_all(broken, 4096)
