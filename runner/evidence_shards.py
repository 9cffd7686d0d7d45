"""Evidence in shards: a run's outputs packed into tar files, with an index.

A run with many outputs is not copied file by file (an fsync and a request each): its
``outputs/`` are packed into ``shards/outputs-NNNNNN.tar`` (plain POSIX tar, up to
``SHARD_FILES`` files or ``SHARD_BYTES`` bytes each), written by a few threads at once, each
shard made durable once (temporary name, one fsync, rename; one request on a URL). The
index ``outputs.index.tsv`` says where each output is: its path (also its member name in
the shard), shard, size, SHA-256 and the offset of its bytes in the shard, so one output
is read without unpacking anything (``read_output``). ``SHA256SUMS`` lists each shard and
the index, so ``sha256sum -c`` still checks the copy; ``verify_shards`` reads every shard
once and checks it against its line and every member against the index.

Whatever lies under ``outputs/`` was written by the team's code: it is walked with
``lstat``, never following a link; a link, a FIFO, a socket, a device, a file over
``MAX_MEMBER_BYTES`` or a name that is not plain UTF-8 without control characters is
refused and named, never opened (``scan_outputs``). Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tarfile
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Callable, Deque, Dict, Iterable, Iterator, List, Optional, Set, Tuple

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


def _no_beat(where: str) -> None:
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
                 beat: Beat = _no_beat) -> Iterator[Output]:
    """The regular files under ``run_dir/tree``, in sorted order, walked with lstat: what
    is not a regular file or a folder, an odd name or a file over ``MAX_MEMBER_BYTES`` is
    appended to ``refused`` (named) and never opened; hidden files (temporary files of an
    interrupted write) are left out."""
    stack = [tree]
    while stack:
        rel_dir = stack.pop()
        beat(f"listing {rel_dir}/")
        try:
            with os.scandir(os.path.join(run_dir, *rel_dir.split("/"))) as found:
                entries = sorted(found, key=lambda e: e.name)
        except FileNotFoundError:
            continue
        subdirs = []
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}"
            odd = name_problem(entry.name)
            if odd is not None:
                refused.append(f"{rel!r}: {odd}: refused, not copied")
                continue
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue  # vanished meanwhile
            if stat.S_ISDIR(st.st_mode):
                subdirs.append(rel)
            elif entry.name.startswith("."):
                continue
            elif not stat.S_ISREG(st.st_mode):
                refused.append(f"{rel}: {file_kind(st.st_mode)}: refused, not copied")
            elif st.st_size > MAX_MEMBER_BYTES:
                refused.append(f"{rel}: {st.st_size} bytes, over the {MAX_MEMBER_BYTES} "
                               "bytes one output may have: refused, not copied")
            else:
                yield Output(rel, entry.path, st.st_size)
        stack.extend(reversed(subdirs))


def file_kind(mode: int) -> str:
    for test, what in ((stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return "not a regular file"


def open_regular(path: str) -> int:
    """A descriptor of ``path`` only if it is a regular file: never through a link
    (``O_NOFOLLOW``), never blocking on a FIFO swapped in since the walk."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise OSError(f"{file_kind(mode)}, not a regular file")
    return fd


def read_regular(path: str, limit: int) -> bytes:
    """The bytes of a regular file (at most ``limit``), opened with ``open_regular``."""
    fd = open_regular(path)
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
    info = tarfile.TarInfo(rel)
    info.size, info.mtime, info.mode = size, int(mtime), 0o644
    info.type = tarfile.REGTYPE
    if len(rel) < 100 and rel.isascii():  # a plain header is enough (and faster)
        return info.tobuf(tarfile.USTAR_FORMAT, "utf-8", "strict")
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "strict")


def _read_all(fd: int, limit: int) -> bytes:
    parts = []
    while limit > 0:
        data = os.read(fd, limit)
        if not data:
            break
        parts.append(data)
        limit -= len(data)
    return b"".join(parts)


def _add(out: _HashingWriter, item: Output, beat: Beat) -> Tuple[int, int, str]:
    """One member written: (offset of its bytes, size, SHA-256)."""
    try:
        fd = open_regular(item.path)
    except OSError as exc:
        raise _Changed(item.rel, f"cannot be read: {exc}") from exc
    try:
        st = os.fstat(fd)
        if st.st_size > MAX_MEMBER_BYTES:
            raise _Changed(item.rel, f"grew to {st.st_size} bytes while it was copied")
        if st.st_size <= SMALL:
            data = _read_all(fd, SMALL + 1)
            if len(data) > SMALL:
                raise _Changed(item.rel, "grew while it was copied")
            out.write(_header(item.rel, len(data), st.st_mtime))
            start, size = out.offset, len(data)
            out.write(data)
            digest = hashlib.sha256(data).hexdigest()
        else:
            start, size, digest = _add_large(out, item, fd, st, beat)
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


def write_shard(store: Any, number: int, items: List[Output], beat: Beat = _no_beat,
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


def pack_outputs(store: Any, outputs: Iterable[Output], beat: Beat = _no_beat,
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


# ------------------------------------------------------------------ reading the copy


class PathSet:
    """A set of paths kept as 16-byte digests (a million paths in ~50 MB, not ~150)."""

    def __init__(self) -> None:
        self._keys: Set[bytes] = set()

    @staticmethod
    def _key(path: str) -> bytes:
        return hashlib.blake2b(path.encode("utf-8", "surrogateescape"), digest_size=16).digest()

    def add(self, path: str) -> None:
        self._keys.add(self._key(path))

    def __contains__(self, path: object) -> bool:
        return isinstance(path, str) and self._key(path) in self._keys

    def __len__(self) -> int:
        return len(self._keys)


@dataclass
class ShardCheck:
    """What verifying the shards found: members verified, their bytes, the problems, and
    the paths the index lists (as digests: a million names in little memory)."""

    members: int = 0
    shards: int = 0
    bytes: int = 0
    problems: List[str] = field(default_factory=list)
    names: PathSet = field(default_factory=lambda: PathSet())


Entry = Tuple[str, int, str, int]  # path, size, sha256, offset


def index_groups(lines: Iterable[str], problems: List[str]
                 ) -> Iterator[Tuple[str, List[Entry]]]:
    """The index's entries, a shard at a time (consecutive lines of one shard)."""
    shard: Optional[str] = None
    entries: List[Entry] = []
    for n, line in enumerate(lines, 1):
        if n == 1 and line.rstrip("\n") == "\t".join(INDEX_COLUMNS):
            continue
        parsed = parse_index_line(line)
        if parsed is None:
            problems.append(f"{INDEX} line {n}: not '{' TAB '.join(INDEX_COLUMNS)}'")
            continue
        path, name, size, digest, offset = parsed
        if name != shard:
            if shard is not None and entries:
                yield shard, entries
            shard, entries = name, []
        entries.append((path, size, digest, offset))
    if shard is not None and entries:
        yield shard, entries


def parse_index_line(line: str) -> Optional[Tuple[str, str, int, str, int]]:
    parts = line.rstrip("\n").split("\t")
    if len(parts) != len(INDEX_COLUMNS):
        return None
    path, shard, size, digest, offset = parts
    if not (size.isdigit() and offset.isdigit() and len(digest) == 64 and _safe_rel(path)
            and _safe_rel(shard) and shard.startswith(f"{SHARDS}/")):
        return None
    return path, shard, int(size), digest.lower(), int(offset)


def _safe_rel(rel: str) -> bool:
    return bool(rel) and not rel.startswith("/") and ".." not in rel.split("/")


class _HashingReader(io.RawIOBase):
    """Hashes every byte read from ``raw`` (the shard's own checksum, in the same pass)."""

    def __init__(self, raw: IO[bytes], beat: Beat, where: str) -> None:
        self.raw, self.sha, self.size, self.beat, self.where = raw, hashlib.sha256(), 0, beat, where

    def readable(self) -> bool:
        return True

    def readinto(self, buf: Any) -> int:
        data = self.raw.read(len(buf))
        n = len(data)
        buf[:n] = data
        self.sha.update(data)
        self.size += n
        self.beat(self.where)
        return n

    def rest(self) -> None:
        while self.readinto(bytearray(CHUNK)):
            pass


def check_shard(store: Any, shard: str, digest: Optional[str], entries: List[Entry],
                beat: Beat = _no_beat) -> Tuple[int, int, List[str]]:
    """Read one shard once: its SHA-256 against ``digest`` (its SHA256SUMS line), every
    member against its index entry, every entry's member present. Returns the members
    that verified, the shard's bytes, the problems (each naming the shard or the path)."""
    problems: List[str] = []
    if digest is None:
        return 0, 0, [f"{shard}: named by {INDEX} but not listed in SHA256SUMS"]
    fh = store.open(shard)
    if fh is None:
        return 0, 0, [f"{shard}: missing"]
    expected = {path: (size, sha) for path, size, sha, _ in entries}
    seen: Set[str] = set()
    good = 0
    with fh:
        reader = _HashingReader(fh, beat, shard)
        try:
            with tarfile.open(fileobj=io.BufferedReader(reader, CHUNK), mode="r|") as tar:
                for member in tar:
                    good += _check_member(tar, shard, member, expected, seen, problems)
        except (tarfile.TarError, EOFError, OSError, ValueError) as exc:
            problems.append(f"{shard}: not a readable tar archive ({exc})")
        reader.rest()
    if reader.sha.hexdigest() != digest:
        problems.insert(0, f"{shard}: checksum mismatch (content changed)")
    problems.extend(f"{path}: in {INDEX} but not in {shard}"
                    for path in expected if path not in seen)
    return good, reader.size, problems


def _check_member(tar: tarfile.TarFile, shard: str, member: tarfile.TarInfo,
                  expected: Dict[str, Tuple[int, str]], seen: Set[str],
                  problems: List[str]) -> int:
    name = member.name
    if not member.isreg():
        problems.append(f"{shard}: member {name!r} is not a regular file")
        return 0
    if name not in expected:
        problems.append(f"{shard}: member {name!r} is not in {INDEX}")
        return 0
    seen.add(name)
    size, sha = expected[name]
    data = tar.extractfile(member)
    h, got = hashlib.sha256(), 0
    if data is not None:
        for chunk in iter(lambda: data.read(CHUNK), b""):
            h.update(chunk)
            got += len(chunk)
    if got != size:
        problems.append(f"{name}: {got} bytes in {shard}, {size} in {INDEX}")
        return 0
    if h.hexdigest() != sha:
        problems.append(f"{name}: checksum mismatch in {shard} (content changed)")
        return 0
    return 1


def verify_shards(store: Any, listed: Dict[str, str], beat: Beat = _no_beat,
                  workers: int = WORKERS) -> ShardCheck:
    """Check the index (already checked against its SHA256SUMS line by the caller) and
    every shard it names, ``workers`` shards at a time; a shard listed in SHA256SUMS that
    the index never names is named too."""
    check = ShardCheck()
    fh = store.open(INDEX)
    if fh is None:
        check.problems.append(f"{INDEX}: missing")
        return check
    named: Set[str] = set()
    pending: Deque[Future[Tuple[int, int, List[str]]]] = deque()
    lock = threading.Lock()

    def drain(keep: int) -> None:
        while len(pending) > keep:
            good, size, problems = pending.popleft().result()
            with lock:
                check.members += good
                check.bytes += size
                check.problems.extend(problems)

    with io.TextIOWrapper(fh, encoding="utf-8", errors="replace", newline="\n") as text, \
            ThreadPoolExecutor(max_workers=workers) as pool:
        for shard, entries in index_groups(text, check.problems):
            if shard in named:
                check.problems.append(f"{INDEX}: {shard} named in two places (the index is "
                                      "written a shard at a time)")
                continue
            named.add(shard)
            for entry in entries:
                check.names.add(entry[0])
            pending.append(pool.submit(check_shard, store, shard, listed.get(shard),
                                       entries, beat))
            drain(2 * workers)
        drain(0)
    check.shards = len(named)
    check.problems.extend(f"{rel}: listed in SHA256SUMS but named by no line of {INDEX}"
                          for rel in sorted(listed) if is_shard(rel) and rel not in named)
    return check


def is_shard(rel: str) -> bool:
    return rel.startswith(f"{SHARDS}/") and rel.endswith(".tar")


def find_output(store: Any, path: str) -> Optional[Tuple[str, int, str, int]]:
    """The index entry of one output: (shard, size, sha256, offset), or None."""
    fh = store.open(INDEX)
    if fh is None:
        return None
    with io.TextIOWrapper(fh, encoding="utf-8", errors="replace", newline="\n") as text:
        for line in text:
            if not line.startswith(path + "\t"):
                continue
            parsed = parse_index_line(line)
            if parsed is not None and parsed[0] == path:
                return parsed[1], parsed[2], parsed[3], parsed[4]
    return None


def read_output(store: Any, shard: str, size: int, digest: str, offset: int,
                out: IO[bytes]) -> Optional[str]:
    """Copy one member's bytes (``offset``, ``size`` from the index) to ``out`` once its
    SHA-256 matches the index (read twice: nothing unchecked is written); the problem,
    naming the shard, when it does not, else None."""
    for writing in (False, True):
        fh = store.open(shard)
        if fh is None:
            return f"{shard}: missing"
        h, left = hashlib.sha256(), size
        with fh:
            fh.seek(offset)
            while left:
                chunk = fh.read(min(CHUNK, left))
                if not chunk:
                    return f"{shard}: ends before the member's bytes do (the shard is cut)"
                h.update(chunk)
                if writing:
                    out.write(chunk)
                left -= len(chunk)
        if h.hexdigest() != digest:
            return f"{shard}: the member's bytes do not match {INDEX} (content changed)"
    return None
