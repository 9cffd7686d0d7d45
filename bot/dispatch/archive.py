"""The upload's one archive stream: a tar written with the stdlib on the bot host.

Every file a dispatch sends to a node (what differs of the runner package, the project,
inputs outside it, the run's spec and manifest, a card proof's files) goes as members of
one tar stream, named relative to the node's workdir, on the launcher's standard input in
framed chunks (a line ``<n>`` then ``n`` bytes; ``0`` ends it: ``node_untar.py`` reads
them on the node). The writer runs in a thread of its own: ``send`` hands each chunk to
the SSH channel and returns once it is on its way, so a slow node holds the writer back
(no archive is ever held in memory). Local files are opened ``O_NOFOLLOW`` (never read
through a link) and must keep their size while they are read.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Union

from bot.errors import DispatchError

CHUNK = 1 << 20  # bytes per framed chunk
TAR_BUFSIZE = 16 << 10  # the tar writer's own buffer (see _Sink)
REPORT_EVERY = 8 << 20  # progress at most every 8 MiB ...
REPORT_EVERY_S = 1.0  # ... or every second, whichever comes first
END = b"0\n"

Entry = tuple[Union[Path, bytes], str]  # (a local file or the bytes themselves, remote path)


def frame(data: bytes) -> bytes:
    """One chunk as the node reads it."""
    return b"%d\n" % len(data) + data


class _Sink:
    """What the tar writer writes into: framed chunks of ``CHUNK`` bytes handed to
    ``send``. The writer's own buffer is kept small (``TAR_BUFSIZE``): tarfile's stream
    appends to an immutable ``bytes`` buffer, whose copying grows with its size (a 1 MiB
    buffer cost 0.2 s for 3,000 small files); the chunks are gathered here instead."""

    def __init__(self, send: Callable[[bytes], None]) -> None:
        self.send = send
        self.buf = bytearray()

    def write(self, data: bytes) -> int:
        self.buf += data
        if len(self.buf) >= CHUNK:
            self.flush()
        return len(data)

    def flush(self) -> None:
        if self.buf:
            self.send(frame(bytes(self.buf)))
            self.buf = bytearray()


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
    with tarfile.open(fileobj=sink, mode="w|",  # type: ignore[call-overload]
                      bufsize=TAR_BUFSIZE, format=tarfile.PAX_FORMAT) as tar:
        for src, dst in entries:
            if not dst.startswith(base):
                raise DispatchError(f"{dst}: not under the node's workdir {workdir}")
            done += _add(tar, src, dst[len(base):])
            if report is not None and (done - last[0] >= REPORT_EVERY
                                       or time.monotonic() - last[1] >= REPORT_EVERY_S):
                report(done, total)
                last = (done, time.monotonic())
    sink.flush()
    send(END)
    if report is not None:
        report(done, total)
    return done


def _add(tar: tarfile.TarFile, src: Path | bytes, name: str) -> int:
    info = tarfile.TarInfo(name)
    info.mtime = int(time.time())
    if isinstance(src, bytes):
        info.size, info.mode = len(src), 0o644
        tar.addfile(info, io.BytesIO(src))
        return len(src)
    try:
        fh = os.fdopen(os.open(src, os.O_RDONLY | os.O_NOFOLLOW), "rb")  # never via a link
    except OSError as exc:
        raise DispatchError(f"{src}: cannot read it to send it: {exc}") from exc
    with fh:
        st = os.fstat(fh.fileno())
        info.size, info.mode = st.st_size, 0o755 if st.st_mode & 0o100 else 0o644
        info.mtime = int(st.st_mtime)
        try:
            tar.addfile(info, fh)
        except OSError as exc:  # tarfile's "unexpected end of data": the file shrank
            raise DispatchError(f"{src}: cannot send it ({exc}); did it change while it "
                                "was sent? Dispatch again") from exc
    return int(st.st_size)
