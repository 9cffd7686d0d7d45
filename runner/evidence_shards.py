"""Evidence in shards: a run's outputs packed into tar files, with an index.

A run with many outputs is not copied file by file (an fsync and a request each): its
``outputs/`` are packed into ``shards/outputs-NNNNNN.tar`` (plain POSIX tar, up to
``SHARD_FILES`` files or ``SHARD_BYTES`` bytes each), written by a few threads at once, each
shard made durable once (temporary name, one fsync, rename; one request on a URL). The
index ``outputs.index.tsv`` says where each output is: its path (also its member name in
the shard), shard, size, SHA-256 and the offset of its bytes in the shard, so one output
is read without unpacking anything (``runner.shard_index``). ``SHA256SUMS`` lists each
shard and the index, so ``sha256sum -c`` still checks the copy; ``verify_shards`` reads
every shard once and checks it against its line and every member against the index.

Whatever lies under ``outputs/`` was written by the team's code: it is walked with
``lstat``, never following a link; a link, a FIFO, a socket, a device, a file over
``MAX_MEMBER_BYTES`` or a name that is not plain UTF-8 without control characters is
refused and named, never opened (``scan_outputs``). Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
import tarfile
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Deque, Iterable, Iterator, List, Optional, Tuple

SHARDS = "shards"
INDEX = "outputs.index.tsv"
INDEX_COLUMNS = ("path", "shard", "size", "sha256", "offset")
SHARD_FILES = 10_000
SHARD_BYTES = 256 << 20
MAX_MEMBER_BYTES = (2 << 30) - (1 << 20)  # a shard stays under the fetch's 2 GiB per file
WORKERS = 4  # shards written (and read back) at once
SMALL = 1 << 20  # a member up to this size is read whole, larger ones in chunks
CHUNK = 1 << 20
BLOCK = tarfile.BLOCKSIZE

Beat = Callable[[str], None]
_CONTROL = re.compile("[\x00-\x1f\x7f]")


def no_beat(where: str) -> None:
    """A ``Beat`` that tells no one (a copy not judged by its progress)."""
    return None


@dataclass(frozen=True)
class Output:
    """One regular file of ``outputs/``: its path in the copy and on this node."""

    rel: str
    path: str
    size: int


@dataclass
class Packed:
    """What packing wrote: ``SHA256SUMS`` lines (shards and index), members, bytes."""

    sums: List[str] = field(default_factory=list)
    members: int = 0
    bytes: int = 0
    problems: List[str] = field(default_factory=list)


def name_problem(name: str) -> Optional[str]:
    """Why a file name cannot be taken into the copy (None when it can)."""
    try:
        name.encode("utf-8")
    except UnicodeEncodeError:
        return "a name that is not UTF-8"
    if _CONTROL.search(name):
        return "a name with a control character (a tab, a newline...)"
    return None


def shard_name(number: int) -> str:
    return f"{SHARDS}/outputs-{number:06d}.tar"


def scan_outputs(run_dir: str, refused: List[str], tree: str = "outputs",
                 beat: Beat = no_beat) -> Iterator[Output]:
    """The regular files under ``run_dir/tree``, in sorted order, walked with lstat: what
    is not a regular file or a folder, an odd name or a file over ``MAX_MEMBER_BYTES`` is
    appended to ``refused`` (named) and never opened; hidden files (temporary files of an
    interrupted write) are left out."""
    try:
        top = os.lstat(os.path.join(run_dir, tree))
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(top.st_mode):
        refused.append(f"{tree}: {file_kind(top.st_mode)}: refused, not copied")
        return
    stack = [tree]
    while stack:
        rel_dir = stack.pop()
        beat(f"listing {rel_dir}/")
        folder = os.path.join(run_dir, *rel_dir.split("/"))
        try:
            names = sorted(os.listdir(folder))  # names only: a million in one folder is
        except FileNotFoundError:               # ~80 MB, as DirEntry objects ~400
            continue
        subdirs = []
        for name in names:
            rel = f"{rel_dir}/{name}"
            odd = name_problem(name)
            if odd is not None:
                refused.append(f"{rel!r}: {odd}: refused, not copied")
                continue
            path = os.path.join(folder, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue  # vanished meanwhile
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
            elif name.startswith("."):
                continue
            elif not stat.S_ISREG(st.st_mode):
                refused.append(f"{rel}: {file_kind(st.st_mode)}: refused, not copied")
            elif st.st_size > MAX_MEMBER_BYTES:
                refused.append(f"{rel}: {st.st_size} bytes, over the {MAX_MEMBER_BYTES} "
                               "bytes one output may have: refused, not copied")
            else:
                yield Output(rel, path, st.st_size)
        stack.extend(reversed(subdirs))


def file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path: str) -> Tuple[int, os.stat_result]:
    """A descriptor of ``path`` (and its fstat) only if it is a regular file: never through
    a link (``O_NOFOLLOW``), never blocking on a FIFO swapped in since the walk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(f"{file_kind(st.st_mode)}, not a regular file")
    return fd, st


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of a regular file (at most ``limit``), opened with ``open_regular``."""
    fd, _ = open_regular(path)
    with os.fdopen(fd, "rb") as fh:
        return fh.read(limit)


class _Changed(Exception):
    """An output changed size while it was packed: its shard is written again without it."""

    def __init__(self, rel: str, why: str) -> None:
        super().__init__(why)
        self.rel, self.why = rel, why


class _HashingWriter:
    """Counts and hashes every byte written to ``raw`` (the shard's SHA-256 line)."""

    def __init__(self, raw: IO[bytes]) -> None:
        self.raw, self.sha, self.offset = raw, hashlib.sha256(), 0

    def write(self, data: bytes) -> None:
        self.raw.write(data)
        self.sha.update(data)
        self.offset += len(data)


def _header(rel: str, size: int, mtime: float) -> bytes:
    """The tar header of one regular file: a plain USTAR block built here for a short
    ASCII name (the common case, ~10x cheaper than tarfile's), tarfile's PAX headers for
    any other name."""
    name = rel.encode("ascii", "replace")
    if len(rel) < 100 and rel.isascii():
        block = b"".join((name.ljust(100, b"\0"), b"0000644\0", b"0000000\0", b"0000000\0",
                          b"%011o\0" % size, b"%011o\0" % int(mtime), b" " * 8, b"0",
                          b"\0" * 100, b"ustar\x0000", b"\0" * 80,
                          b"\0" * 167))
        return block[:148] + b"%06o\0" % sum(block) + block[155:]
    info = tarfile.TarInfo(rel)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    info.type = tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _add(out: _HashingWriter, item: Output, beat: Beat) -> Tuple[int, int, str]:
    """One member written: (offset of its bytes, size, SHA-256)."""
    try:
        fd, st = open_regular(item.path)
    except OSError as exc:
        raise _Changed(item.rel, f"cannot be read: {exc}") from exc
    try:
        if st.st_size > MAX_MEMBER_BYTES:
            raise _Changed(item.rel, f"grew to {st.st_size} bytes while it was copied")
        if st.st_size > SMALL:
            start, size, digest = _add_large(out, item, fd, st, beat)
        else:
            # one read: a regular file reads short only at its end, so st_size + 1 bytes
            # back means it grew since fstat
            data = os.read(fd, st.st_size + 1)
            if len(data) > st.st_size:
                raise _Changed(item.rel, "grew while it was copied")
            head = _header(item.rel, len(data), st.st_mtime)
            start, size = out.offset + len(head), len(data)
            out.write(head + data + b"\0" * (-size % BLOCK))
            return start, size, hashlib.sha256(data).hexdigest()
    finally:
        os.close(fd)
    pad = -size % BLOCK
    if pad:
        out.write(b"\0" * pad)
    return start, size, digest


def _add_large(out: _HashingWriter, item: Output, fd: int, st: os.stat_result,
               beat: Beat) -> Tuple[int, int, str]:
    """A large member copied a MiB at a time (a beat each): it must keep its size."""
    size, sha = st.st_size, hashlib.sha256()
    out.write(_header(item.rel, size, st.st_mtime))
    start, left = out.offset, size
    while left:
        chunk = os.read(fd, min(CHUNK, left))
        if not chunk:
            raise _Changed(item.rel, "shrank while it was copied")
        out.write(chunk)
        sha.update(chunk)
        left -= len(chunk)
        beat(item.rel)
    return start, size, sha.hexdigest()


def write_shard(store: Any, number: int, items: List[Output], beat: Beat = no_beat,
                ) -> Tuple[str, List[str], int, List[str]]:
    """Write one shard (durably: ``store.create``), then return its SHA256SUMS line, its
    index lines, its size and the outputs left out (changed while packed: named). A shard
    cut off midway never appears under its name."""
    rel = shard_name(number)
    dropped: List[str] = []
    while True:
        lines: List[str] = []
        try:
            with store.create(rel) as raw:
                out = _HashingWriter(raw)
                for item in items:
                    beat(f"{rel} ({item.rel})")
                    start, size, digest = _add(out, item, beat)
                    lines.append(f"{item.rel}\t{rel}\t{size}\t{digest}\t{start}\n")
                out.write(b"\0" * (2 * BLOCK))  # the end of the archive
                out.write(b"\0" * (-out.offset % tarfile.RECORDSIZE))
        except _Changed as exc:  # written again without it: what is in a shard is whole
            dropped.append(f"{exc.rel}: {exc.why}: left out of the copy")
            items = [i for i in items if i.rel != exc.rel]
            continue
        return f"{out.sha.hexdigest()}  {rel}\n", lines, out.offset, dropped


def group(outputs: Iterable[Output], max_files: int = SHARD_FILES,
          max_bytes: int = SHARD_BYTES) -> Iterator[List[Output]]:
    """The outputs in shards of at most ``max_files`` files and ``max_bytes`` bytes (a
    single larger file alone)."""
    batch: List[Output] = []
    size = 0
    for item in outputs:
        if batch and (len(batch) >= max_files or size + item.size > max_bytes):
            yield batch
            batch, size = [], 0
        batch.append(item)
        size += item.size
    if batch:
        yield batch


def pack_outputs(store: Any, outputs: Iterable[Output], beat: Beat = no_beat,
                 workers: int = WORKERS, max_files: int = SHARD_FILES,
                 max_bytes: int = SHARD_BYTES) -> Packed:
    """Pack ``outputs`` into shards written ``workers`` at a time (at most twice as many
    planned ahead: memory stays bounded), then write the index in shard order."""
    packed = Packed()
    pending: Deque[Future[Tuple[str, List[str], int, List[str]]]] = deque()
    with store.create(INDEX) as raw, ThreadPoolExecutor(max_workers=workers) as pool:
        index = _HashingWriter(raw)
        index.write(("\t".join(INDEX_COLUMNS) + "\n").encode("utf-8"))

        def drain(keep: int) -> None:
            while len(pending) > keep:
                line, lines, size, dropped = pending.popleft().result()
                packed.sums.append(line)
                packed.members += len(lines)
                packed.bytes += size
                packed.problems.extend(dropped)
                index.write("".join(lines).encode("utf-8"))

        try:
            for number, batch in enumerate(group(outputs, max_files, max_bytes)):
                pending.append(pool.submit(write_shard, store, number, batch, beat))
                drain(2 * workers)
            drain(0)
        except BaseException:
            for waiting in pending:
                waiting.cancel()
            raise
    packed.sums.append(f"{index.sha.hexdigest()}  {INDEX}\n")
    packed.bytes += index.offset
    return packed
