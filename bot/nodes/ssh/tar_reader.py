"""A tar stream read as it arrives from a node, member by member, never trusted.

The node's fetch program (``bot/node_programs/fetch_stream.py``) writes a PAX tar stream;
this reads it from an asyncssh process's binary stdout (any ``read(n)`` coroutine) without
a thread and without holding a member in memory: ``next()`` gives a member's header
(its PAX records applied: a long ``path``, ``size``, ``linkpath``, the ``HELD`` mark),
``chunks()`` its bytes, exactly as many as the header says, ``BLOCK`` at a time. A
header that does not parse, a PAX header over ``PAX_MAX`` bytes or a stream that ends
before its end-of-archive block raises ``TarStreamError`` (the caller tells a cut
connection from a broken stream by the process's exit status).
"""

from __future__ import annotations

import tarfile
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass

from bot.node_programs.fetch_stream import HELD

RECORD = 512
BLOCK = 1 << 20  # the most read from the stream at once
PAX_MAX = 1 << 20  # a PAX header is a few names long; more is not ours


class TarStreamError(Exception):
    """The stream is not a tar stream, or it ended early."""


@dataclass(frozen=True)
class Member:
    name: str
    type: bytes
    size: int
    linkname: str = ""
    held: str | None = None  # the digest of the file the bot already holds (not sent)

    @property
    def is_dir(self) -> bool:
        return self.type == tarfile.DIRTYPE

    @property
    def is_file(self) -> bool:
        return self.type in (tarfile.REGTYPE, tarfile.AREGTYPE)


class TarReader:
    """``read(n)``: up to ``n`` bytes of the stream, ``b""`` at its end."""

    def __init__(self, read: Callable[[int], Awaitable[bytes]]) -> None:
        self._read = read
        self._buf = bytearray()
        self.received = 0  # bytes of the stream so far, headers and padding included

    async def _exactly(self, n: int) -> bytes:
        while len(self._buf) < n:
            chunk = await self._read(max(BLOCK, n - len(self._buf)))
            if not chunk:
                raise TarStreamError(f"the stream ended after {self.received} bytes, in the "
                                     "middle of an entry")
            self.received += len(chunk)
            self._buf += chunk
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out

    async def next(self) -> Member | None:
        """The next member's header, None at the end of the archive."""
        pax: dict[str, str] = {}
        longname: str | None = None
        while True:
            block = await self._exactly(RECORD)
            if block == bytes(RECORD):
                return None
            try:
                info = tarfile.TarInfo.frombuf(block, "utf-8", "surrogateescape")
            except tarfile.HeaderError as exc:
                raise TarStreamError(f"not a tar header after {self.received} bytes: "
                                     f"{exc}") from exc
            if info.type in (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.GNUTYPE_LONGNAME):
                if info.size > PAX_MAX:
                    raise TarStreamError(f"an extended header of {info.size} bytes (over "
                                         f"{PAX_MAX})")
                data = (await self._exactly(_padded(info.size)))[:info.size]
                if info.type == tarfile.XHDTYPE:
                    pax.update(_pax_records(data))
                elif info.type == tarfile.GNUTYPE_LONGNAME:
                    longname = data.rstrip(b"\0").decode("utf-8", "surrogateescape")
                continue
            try:
                size = int(pax["size"]) if "size" in pax else info.size
            except ValueError as exc:
                raise TarStreamError(f"a PAX size that is not a number: {pax['size']!r}") \
                    from exc
            if size < 0:
                raise TarStreamError(f"a negative size: {size}")
            return Member(pax.get("path", longname or info.name), info.type, size,
                          pax.get("linkpath", info.linkname), pax.get(HELD))

    async def chunks(self, member: Member) -> AsyncIterator[bytes]:
        """The member's bytes, as they arrive (its padding read after them). A regular
        file's only: other members' sizes are not read as data."""
        left = member.size if member.is_file else 0
        while left:
            if self._buf:
                piece = bytes(self._buf[:left])
                del self._buf[:len(piece)]
            else:
                piece = await self._read(min(BLOCK, left))
                if not piece:
                    raise TarStreamError(f"the stream ended after {self.received} bytes, "
                                         f"in the middle of {member.name!r}")
                self.received += len(piece)
            left -= len(piece)
            yield piece
        if member.is_file:
            await self._exactly(_padded(member.size) - member.size)


def _padded(size: int) -> int:
    return -(-size // RECORD) * RECORD


def _pax_records(data: bytes) -> dict[str, str]:
    """``<length> <key>=<value>\\n`` records; a malformed one ends the header."""
    out: dict[str, str] = {}
    pos = 0
    while pos < len(data):
        space = data.find(b" ", pos)
        try:
            length = int(data[pos:space])
        except ValueError as exc:
            raise TarStreamError("a PAX header that does not parse") from exc
        record = data[space + 1:pos + length]
        if length <= 0 or not record.endswith(b"\n") or b"=" not in record:
            raise TarStreamError("a PAX header that does not parse")
        key, _, value = record[:-1].partition(b"=")
        out[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos += length
    return out
