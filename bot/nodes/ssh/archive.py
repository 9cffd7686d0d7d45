"""The upload's one archive stream: a tar written on the bot host (ustar headers; a long
or non-ASCII name gets tarfile's pax header), read on the node with the stdlib tarfile.

Every file a dispatch sends to a node (what differs of the runner package, the project,
inputs outside it, the run's spec and manifest, a card proof's files) goes as members of
one tar stream, named relative to the node's workdir, on the launcher's standard input in
framed chunks (a line ``<n>`` then ``n`` bytes; ``0`` ends it: ``untar.py`` reads
them on the node). The writer runs in a thread of its own: ``send`` hands each chunk to
the SSH channel and returns once it is on its way, so a slow node holds the writer back
(no archive is ever held in memory). Local files are opened ``O_NOFOLLOW`` (never read
through a link) and must keep their size while they are read.
"""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Union

from bot.errors import DispatchError

CHUNK = 1 << 20  # bytes per framed chunk
BLOCK = tarfile.BLOCKSIZE  # 512: a tar header, and what each member is padded to
ZERO8 = b"0000000\0"  # an 8-byte octal field holding 0 (uid, gid)
REPORT_EVERY = 8 << 20  # progress at most every 8 MiB ...
REPORT_EVERY_S = 1.0  # ... or every second, whichever comes first
END = b"0\n"

Entry = tuple[Union[Path, bytes], str]  # (a local file or the bytes themselves, remote path)


def frame(data: bytes) -> bytes:
    """One chunk as the node reads it."""
    return b"%d\n" % len(data) + data


class _Sink:
    """Framed chunks of ``CHUNK`` bytes handed to ``send``, gathered in a ``bytearray``
    (appending to it costs what is appended, not the size of what is already there)."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self.send = send
        self.buf = bytearray()
        self.written = 0

    def write(self, data: bytes) -> None:
        self.buf += data
        self.written += len(data)
        if len(self.buf) >= CHUNK:
            self.flush()

    def pad(self, size: int) -> None:
        """Zeros up to the next tar block after ``size`` bytes of a member."""
        if size % BLOCK:
            self.write(bytes(BLOCK - size % BLOCK))

    def flush(self) -> None:
        if self.buf:
            self.send(frame(bytes(self.buf)))
            self.buf = bytearray()


def header(name: str, size: int, mode: int, mtime: int) -> bytes:
    """A regular file's tar header, as ``tarfile`` writes it in the PAX format: a plain
    ustar block for a short ASCII name (written here: tarfile's own took about 30 us a
    file, 0.1 s for a 3,000-file project), else tarfile's (a pax header first)."""
    raw = name.encode("utf-8", "surrogateescape")
    if (len(raw) > 100 or not raw.isascii() or not 0 <= size < 8 ** 11
            or not 0 <= mtime < 8 ** 11):
        info = tarfile.TarInfo(name)
        info.size, info.mode, info.mtime = size, mode, mtime
        return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    block = b"".join((raw.ljust(100, b"\0"), b"%07o\0" % (mode & 0o7777), ZERO8, ZERO8,
                      b"%011o\0" % size, b"%011o\0" % mtime, b" " * 8, tarfile.REGTYPE,
                      bytes(100), tarfile.POSIX_MAGIC)).ljust(BLOCK, b"\0")
    return block[:148] + b"%06o\0 " % sum(block) + block[156:]


def total_bytes(entries: list[Entry]) -> int:
    """The content bytes the archive carries (what progress counts, headers left out)."""
    return sum(len(src) if isinstance(src, bytes) else src.stat().st_size
               for src, _dst in entries)


def write_archive(entries: list[Entry], workdir: str, send: Callable[[bytes], None],
                  report: Callable[[int, int], None] | None = None) -> int:
    """The tar of ``entries`` (each remote path under ``workdir``) in framed chunks to
    ``send``, then the end mark; ``report(bytes done, bytes in all)`` at the start, every
    ``REPORT_EVERY`` bytes or second, and at the end. Returns the content bytes sent."""
    total, done, last = total_bytes(entries), 0, (0, time.monotonic())
    if report is not None:
        report(0, total)
    base = workdir.rstrip("/") + "/"
    sink = _Sink(send)
    for src, dst in entries:
        if not dst.startswith(base):
            raise DispatchError(f"{dst}: not under the node's workdir {workdir}")
        done += _add(sink, src, dst[len(base):])
        if report is not None and (done - last[0] >= REPORT_EVERY
                                   or time.monotonic() - last[1] >= REPORT_EVERY_S):
            report(done, total)
            last = (done, time.monotonic())
    sink.write(bytes(2 * BLOCK))  # the archive's end, padded to a whole record as tarfile's
    if sink.written % tarfile.RECORDSIZE:
        sink.write(bytes(tarfile.RECORDSIZE - sink.written % tarfile.RECORDSIZE))
    sink.flush()
    send(END)
    if report is not None:
        report(done, total)
    return done


def _add(sink: _Sink, src: Path | bytes, name: str) -> int:
    if isinstance(src, bytes):
        sink.write(header(name, len(src), 0o644, int(time.time())))
        sink.write(src)
        sink.pad(len(src))
        return len(src)
    try:
        fh = os.fdopen(os.open(src, os.O_RDONLY | os.O_NOFOLLOW), "rb")  # never via a link
    except OSError as exc:
        raise DispatchError(f"{src}: cannot read it to send it: {exc}") from exc
    with fh:
        st = os.fstat(fh.fileno())
        size = st.st_size
        sink.write(header(name, size, 0o755 if st.st_mode & 0o100 else 0o644,
                          int(st.st_mtime)))
        left = size
        while left:  # exactly the size the header gave
            chunk = fh.read(min(left, CHUNK))
            if not chunk:
                raise DispatchError(f"{src}: cannot send it (it ended {left} bytes before "
                                    f"its size, {size}); did it change while it was sent? "
                                    "Dispatch again")
            sink.write(chunk)
            left -= len(chunk)
        sink.pad(size)
    return int(size)
