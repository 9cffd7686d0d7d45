"""One node's outputs brought to the head as a stream of bounded chunks, each file
verified before it takes its final name.

The head plans from the node's listing (relative path, size, SHA-256 as the node read
them) and the worker's record of each shard (size and SHA-256 when it wrote it, kept on
the head: ``runner/volume_collect.py``'s ``ShardBook``). A file already on the head that
verifies is skipped (a resumed collection brings only what is missing); the others are
asked for in requests of at most ``CHUNK`` bytes (several small files, or one piece of a
large one), ``IN_FLIGHT`` requests on the way at once. Each file is written to a
temporary name in its final folder (never through a link), hashed as it arrives, and
renamed only when its size and SHA-256 match: a shard that differs from its record is
refused by name and nothing is replaced. A node's outputs count against its cap
(``volume.collect_max_bytes``): the files past it are left on the node, named. Standard
library only; the transport (Ray on a cluster, a fake in tests) is a ``Source``.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable, Deque, Dict, List, Optional, Protocol, Set, Tuple

from runner.files import TEMP_MARK

CHUNK = 8 << 20   # bytes asked of a node in one request
IN_FLIGHT = 2     # requests on the way to one node at once
Beat = Callable[[str], None]
Piece = Tuple[str, int, int]  # (path under outputs/, offset, length)


class Source(Protocol):
    """One node's side of the stream: ``send`` starts a read of ``pieces`` (their bytes
    come back in order from ``take``, which raises when the node does not answer)."""

    where: str

    def send(self, pieces: List[Piece]) -> Any: ...

    def take(self, token: Any) -> List[bytes]: ...


@dataclass(frozen=True)
class Want:
    rel: str       # under outputs/
    size: int
    sha256: str


@dataclass
class NodeResult:
    """What one node's collection did: files and bytes brought, those already on the head,
    its seconds, and what it refused (each naming the node and the file)."""

    where: str
    files: int = 0
    bytes: int = 0
    present_files: int = 0
    present_bytes: int = 0
    seconds: float = 0.0
    problems: List[str] = field(default_factory=list)
    verified: Set[str] = field(default_factory=set)  # outputs/-relative: on the head, checked
    named: Set[str] = field(default_factory=set)  # outputs/-relative: left out, said why

    def refuse(self, rels: Any, why: str) -> None:
        """``why`` (naming the node and the first file) for ``rels``, left out."""
        self.named.update(rels)
        self.problems.append(why)

    def facts(self) -> Dict[str, Any]:
        return {"where": self.where, "files": self.files, "bytes": self.bytes,
                "present_files": self.present_files, "present_bytes": self.present_bytes,
                "seconds": round(self.seconds, 3), "problems": len(self.problems)}


def plan(top: str, where: str, files: Dict[str, Any], recorded: Dict[str, Tuple[int, str]],
         cap: int, beat: Beat) -> Tuple[List[Want], NodeResult]:
    """What to ask node ``where`` for: its ``files`` (rel -> [size, sha256] as listed)
    not already on the head under ``top`` (the head's ``outputs/``) with the expected
    content; the expected content of a shard is the worker's record in ``recorded``
    (``outputs/``-relative path -> (size, sha256)), else the node's listing. A shard the
    node holds with other content than recorded is refused here, not transferred."""
    result = NodeResult(where)
    wants: List[Want] = []
    used = 0
    names = sorted(files)
    for index, rel in enumerate(names):
        if index % 1000 == 0:
            beat(f"collect: {where}: checking the head's copies ({index} of {len(names)})")
        size, digest = _entry(files[rel])
        if size is None or digest is None or not _inside(rel):
            result.refuse([rel], f"{where}: outputs/{rel}: not a valid listing entry; "
                                 "left on the node")
            continue
        want = Want(rel, size, digest)
        record = recorded.get(f"outputs/{rel}")
        if record is not None and record != (size, digest):
            result.refuse(
                [rel], f"{where}: outputs/{rel}: {size} bytes, SHA-256 {digest[:16]}… on the node, "
                f"but its worker recorded {record[0]} bytes, {record[1][:16]}… (changed "
                "after it was written): refused, nothing replaced")
            continue
        if used + size > cap:
            result.refuse(
                names[index:], f"{where}: its outputs pass the cap of {cap} bytes a node may send "
                f"(volume.collect_max_bytes) at outputs/{rel}: {len(files) - index} file(s) "
                f"from there on left on the node, the {index} before it kept")
            break
        used += size
        if present(os.path.join(top, rel), want):
            result.verified.add(rel)
            result.present_files += 1
            result.present_bytes += size
        else:
            wants.append(want)
    return wants, result


def stream(source: Source, top: str, wants: List[Want], result: NodeResult,
           beat: Beat, tag: str = "c") -> NodeResult:
    """Bring ``wants`` from ``source`` into ``top``, ``IN_FLIGHT`` requests at a time;
    ``result`` (from ``plan``) counts what came and names what was refused. A node that
    stops answering ends its stream (named); the files it completed stay."""
    began = time.monotonic()
    requests = _requests(wants)
    sink = _Sink(top, {w.rel: w for w in wants}, result, tag)
    pending: Deque[Tuple[List[Piece], Any]] = deque()
    try:
        while requests or pending:
            while requests and len(pending) < IN_FLIGHT:
                pieces = requests.popleft()
                pending.append((pieces, source.send(pieces)))
            pieces, token = pending.popleft()
            try:
                chunks = source.take(token)
            except Exception as exc:  # the node or the cluster is gone: what came stays
                result.refuse({w.rel for w in wants} - result.verified,
                              f"{source.where}: no answer while sending outputs/"
                              f"{pieces[0][0]}: {type(exc).__name__}: {str(exc)[:300]}; "
                              "the rest left on the node")
                break
            sink.take(pieces, chunks)
            beat(f"collect: {source.where}: {result.files} file(s), {result.bytes} bytes")
    finally:
        sink.close()
        result.seconds += time.monotonic() - began
    return result


def _requests(wants: List[Want]) -> Deque[List[Piece]]:
    """The pieces of ``wants`` in order, packed into requests of at most ``CHUNK``."""
    out: Deque[List[Piece]] = deque()
    current: List[Piece] = []
    room = CHUNK
    for want in wants:
        offset = 0
        while offset < want.size or (want.size == 0 and offset == 0):
            length = min(room, want.size - offset)
            current.append((want.rel, offset, length))
            offset += length
            room -= length
            if room == 0:
                out.append(current)
                current, room = [], CHUNK
            if want.size == 0:
                break
    if current:
        out.append(current)
    return out


class _Sink:
    """Writes the pieces as they come, one file at a time, each verified at its end."""

    def __init__(self, top: str, wants: Dict[str, Want], result: NodeResult,
                 tag: str) -> None:
        self.top, self.wants, self.result, self.tag = top, wants, result, tag
        self.rel: Optional[str] = None
        self.fd: Optional[int] = None
        self.tmp = ""
        self.hash: Any = None
        self.done = 0
        self.failed: Set[str] = set()

    def take(self, pieces: List[Piece], chunks: Any) -> None:
        if not isinstance(chunks, list) or len(chunks) != len(pieces):
            got = len(chunks) if isinstance(chunks, list) else type(chunks).__name__
            for rel in dict.fromkeys(p[0] for p in pieces):
                self._refuse(rel, f"the node answered {got} piece(s) for {len(pieces)}")
            return
        for (rel, offset, length), data in zip(pieces, chunks):
            if rel in self.failed:
                continue
            if not isinstance(data, bytes) or len(data) != length:
                n = len(data) if isinstance(data, bytes) else type(data).__name__
                self._refuse(rel, f"the node sent {n} bytes at offset {offset} for the "
                                  f"{length} asked (changed on the node?)")
                continue
            try:
                self._write(rel, offset, data)
            except OSError as exc:  # the head's disk: this file refused, the others go on
                self._refuse(rel, f"cannot be written on the head ({type(exc).__name__}: "
                                  f"{exc.strerror or exc})")

    def _write(self, rel: str, offset: int, data: bytes) -> None:
        if offset == 0 and not self._open(rel):
            return
        if self.fd is None or self.rel != rel or offset != self.done:
            self._refuse(rel, f"a piece at offset {offset} came out of order")
            return
        os.write(self.fd, data)
        self.hash.update(data)
        self.done += len(data)
        if self.done == self.wants[rel].size:
            self._finish(rel)

    def _open(self, rel: str) -> bool:
        self.close()
        path = os.path.join(self.top, rel)
        folder = os.path.dirname(path)
        os.makedirs(folder, exist_ok=True)
        if os.path.realpath(folder) != os.path.normpath(os.path.abspath(folder)):
            self._refuse(rel, "its folder on the head leads elsewhere through a link")
            return False
        self.tmp = os.path.join(folder, f".{os.path.basename(rel)}{TEMP_MARK}{os.getpid()}"
                                         f"-{self.tag}")
        if os.path.lexists(self.tmp):
            os.remove(self.tmp)  # a killed collection's, of this same process id
        self.fd = os.open(self.tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        self.rel, self.hash, self.done = rel, hashlib.sha256(), 0
        return True

    def _finish(self, rel: str) -> None:
        assert self.fd is not None
        want = self.wants[rel]
        os.fsync(self.fd)
        os.close(self.fd)
        self.fd = None
        digest = self.hash.hexdigest()
        path = os.path.join(self.top, rel)
        if digest != want.sha256:
            os.remove(self.tmp)
            self._refuse(rel, f"received with SHA-256 {digest[:16]}…, expected "
                              f"{want.sha256[:16]}…: refused, nothing replaced")
            return
        if os.path.islink(path) or os.path.isdir(path):
            os.remove(self.tmp)
            self._refuse(rel, "the head holds a link or a folder under that name (kept)")
            return
        if os.path.lexists(path) and not rel.startswith("shards/"):
            os.remove(self.tmp)  # a handler's own file: two nodes wrote the same name
            self._refuse(rel, "the head holds another file under that name (kept)")
            return
        os.replace(self.tmp, path)  # a shard that did not verify on the head is replaced
        self.rel = None
        self.result.verified.add(rel)
        self.result.files += 1
        self.result.bytes += want.size

    def _refuse(self, rel: str, why: str) -> None:
        if rel == self.rel:
            self.close()
        self.failed.add(rel)
        self.result.refuse([rel], f"{self.result.where}: outputs/{rel}: {why}")

    def close(self) -> None:
        """Drop the file being written, if any (a stream cut midway)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            if os.path.lexists(self.tmp):
                os.remove(self.tmp)
        self.rel = None


def _entry(entry: Any) -> Tuple[Optional[int], Optional[str]]:
    if isinstance(entry, (list, tuple)) and len(entry) == 2 and isinstance(entry[0], int) \
            and not isinstance(entry[0], bool) and entry[0] >= 0 \
            and isinstance(entry[1], str) and len(entry[1]) == 64:
        return entry[0], entry[1]
    return None, None


def _inside(rel: Any) -> bool:
    return isinstance(rel, str) and bool(rel) and not rel.startswith("/") \
        and ".." not in rel.split("/") and "\\" not in rel and "\0" not in rel


def present(path: str, want: Want) -> bool:
    """Whether the head already holds ``want`` at ``path`` (a regular file, not a link,
    of its size and SHA-256)."""
    try:
        st = os.lstat(path)
    except OSError:
        return False
    if not stat.S_ISREG(st.st_mode) or st.st_size != want.size:
        return False
    return sha256_of(path) == want.sha256


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
