"""Reading an evidence copy's shards through their index: every shard read once (its own
SHA-256 and every member in the same pass, a few shards at a time), every member against
its index entry and every entry's member present (``verify_shards``); one output found
and read without unpacking anything (``find_output``, ``read_output``). A shard or index
a third party changed is named, never trusted. Standard library only.
"""

from __future__ import annotations

import hashlib
import io
import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import IO, Any, Deque, Dict, Iterable, Iterator, List, Optional, Protocol, Set, Tuple

from runner.evidence_shards import (
    BLOCK,
    CHUNK,
    INDEX,
    INDEX_COLUMNS,
    SHARDS,
    SMALL,
    WORKERS,
    Beat,
    no_beat,
)

_ZERO = bytes(BLOCK)


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


class _ShardReader:
    """Reads a shard in order, hashing every byte (the shard's own checksum, in the same
    pass as its members)."""

    def __init__(self, raw: IO[bytes], beat: Beat, where: str) -> None:
        self.raw, self.sha, self.size, self.beat, self.where = raw, hashlib.sha256(), 0, beat, where

    def read(self, n: int) -> bytes:
        """Up to ``n`` bytes (fewer only at the end of the shard)."""
        parts, left = [], n
        while left:
            data = self.raw.read(left)
            if not data:
                break
            parts.append(data)
            left -= len(data)
        data = parts[0] if len(parts) == 1 else b"".join(parts)
        self.sha.update(data)
        self.size += len(data)
        return data

    def skip(self, n: int) -> None:
        while n > 0:
            data = self.read(min(CHUNK, n))
            if not data:
                raise ValueError("it ends inside a member")
            n -= len(data)

    def rest(self) -> None:
        while self.read(CHUNK):
            self.beat(self.where)


def _octal(field: bytes) -> int:
    return int(field.split(b"\0", 1)[0].strip() or b"0", 8)  # ValueError on anything else


def _pax_path(data: bytes) -> Optional[str]:
    """The ``path`` record of a PAX extended header (``"<len> path=<name>\\n"``)."""
    path, pos = None, 0
    while pos < len(data) and data[pos:pos + 1] != b"\0":
        space = data.index(b" ", pos)
        length = int(data[pos:space])
        key, sep, value = data[space + 1:pos + length - 1].partition(b"=")
        if length <= 0 or not sep:
            raise ValueError("a PAX header that is not '<length> <key>=<value>' records")
        if key == b"path":
            path = value.decode("utf-8")
        pos += length
    return path


def _members(r: _ShardReader) -> Iterator[Tuple[str, int, bytes]]:
    """(name, size, type flag) of each member, in order; the caller reads each member's
    bytes and padding before asking for the next. Only what ``write_shard`` writes is
    understood (USTAR headers, PAX ``path`` records); anything else raises ValueError."""
    path: Optional[str] = None
    while True:
        block = r.read(BLOCK)
        if len(block) < BLOCK:
            raise ValueError("it ends without its end-of-archive blocks")
        if block == _ZERO:
            return
        if sum(block) - sum(block[148:156]) + 256 != _octal(block[148:156]):
            raise ValueError(f"a header at byte {r.size - BLOCK} has a wrong checksum")
        size, kind = _octal(block[124:136]), block[156:157]
        if kind == b"x":
            if size > SMALL:
                raise ValueError("a PAX header over 1 MiB")
            path = _pax_path(r.read(size + (-size % BLOCK))[:size]) or path
            continue
        if path is None:
            name, prefix = block[:100].split(b"\0", 1)[0], block[345:500].split(b"\0", 1)[0]
            path = ((prefix + b"/" if prefix and block[257:262] == b"ustar" else b"")
                    + name).decode("utf-8")
        yield path, size, kind
        path = None


def check_shard(store: Any, shard: str, digest: Optional[str], entries: List[Entry],
                beat: Beat = no_beat) -> Tuple[int, int, List[str]]:
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
        reader = _ShardReader(fh, beat, shard)
        try:
            for name, size, kind in _members(reader):
                good += _check_member(reader, shard, name, size, kind, expected, seen,
                                      problems)
        except (ValueError, OSError) as exc:
            problems.append(f"{shard}: not a readable tar archive ({exc})")
        reader.rest()
    if reader.sha.hexdigest() != digest:
        problems.insert(0, f"{shard}: checksum mismatch (content changed)")
    problems.extend(f"{path}: in {INDEX} but not in {shard}"
                    for path in expected if path not in seen)
    return good, reader.size, problems


def check_whole_shard(store: Any, shard: str, digest: Optional[str], entries: List[Entry],
                      beat: Beat = no_beat) -> Tuple[int, int, List[str]]:
    """One shard read back whole against its SHA256SUMS line (``check_shard`` without
    parsing its members): its entries count as verified when it matches."""
    if digest is None:
        return 0, 0, [f"{shard}: named by {INDEX} but not listed in SHA256SUMS"]
    fh = store.open(shard)
    if fh is None:
        return 0, 0, [f"{shard}: missing"]
    with fh:
        reader = _ShardReader(fh, beat, shard)
        reader.rest()
    if reader.sha.hexdigest() != digest:
        return 0, reader.size, [f"{shard}: checksum mismatch (content changed)"]
    return len(entries), reader.size, []


def _check_member(r: _ShardReader, shard: str, name: str, size: int, kind: bytes,
                  expected: Dict[str, Tuple[int, str]], seen: Set[str],
                  problems: List[str]) -> int:
    """One member's bytes read (and its padding) and judged against the index: 1 when it
    matches."""
    pad = -size % BLOCK
    problem = None
    if kind not in (b"0", b"\0"):
        problem = f"{shard}: member {name!r} is not a regular file"
    elif name not in expected:
        problem = f"{shard}: member {name!r} is not in {INDEX}"
    elif name in seen:
        problem = f"{shard}: member {name!r} appears twice"
    if problem is not None:
        problems.append(problem)
        r.skip(size + pad)
        return 0
    seen.add(name)
    r.beat(f"{shard} ({name})")
    h, left = hashlib.sha256(), size
    while left:
        chunk = r.read(min(CHUNK, left))
        if not chunk:
            raise ValueError(f"it ends inside member {name!r}")
        h.update(chunk)
        left -= len(chunk)
    r.skip(pad)
    want_size, want_sha = expected[name]
    if size != want_size:
        problems.append(f"{name}: {size} bytes in {shard}, {want_size} in {INDEX}")
        return 0
    if h.hexdigest() != want_sha:
        problems.append(f"{name}: checksum mismatch in {shard} (content changed)")
        return 0
    return 1


def verify_shards(store: Any, listed: Dict[str, str], beat: Beat = no_beat,
                  workers: int = WORKERS, members: bool = True) -> ShardCheck:
    """Check the index (already checked against its SHA256SUMS line by the caller) and
    every shard it names, ``workers`` shards at a time; a shard listed in SHA256SUMS that
    the index never names is named too. ``members=False`` (the copy's own read-back, just
    after it packed the shards from the same bytes it hashed): each shard against its
    line only, its members not parsed again."""
    check_one = check_shard if members else check_whole_shard
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
            pending.append(pool.submit(check_one, store, shard, listed.get(shard), entries,
                                       beat))
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


class Sink(Protocol):
    """Where checked bytes go (a binary file, standard output, a line picker)."""

    def write(self, data: bytes, /) -> Any: ...


def read_output(store: Any, shard: str, size: int, digest: str, offset: int,
                out: Sink) -> Optional[str]:
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
