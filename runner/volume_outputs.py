"""A several-node volume's outputs, collected to the head before its evidence is made.

A handler that writes files itself into ``ctx.outputs_dir`` writes them on the node its
worker runs on (``<that node's workdir>/runs/<run>/outputs/``). Once the driver's pass is
over, while the workers are still up, one worker of each node other than the head lists
its node's ``outputs/`` (``node_listing``: lstat walk, links, FIFOs, sockets and devices
refused, temporary files of a killed write left out, sizes capped) and the driver copies
each file to the head's ``outputs/`` under the same relative name, in chunks, checking
its size and SHA-256 against the node's listing once written (a temporary name, then a
rename, never through a link). The evidence stage that follows then copies and
checksums them with the rest (``SHA256SUMS``). Whatever a node sends back passes the same
rules as the bot's fetch (``bot/dispatch/fetch.py``): a node whose listing holds a link or
a special file has none of its outputs collected, and the refusal names the node and the
path (its files stay on the node). A file the head already holds with other content is
not replaced (named). Standard library only.
"""

from __future__ import annotations

import hashlib
import os
import stat
from typing import Any, Callable, Dict, List, Optional

from runner.files import is_temp_name, write_json_atomic

MAX_FILE_BYTES = 2 << 30
MAX_BYTES = 4 << 30  # in all, per node
CHUNK = 8 << 20

Listing = Dict[str, Any]  # {"run_dir", "files": {rel: [size, sha256]}, "refused": [...]}


def node_listing(run_dir: Optional[str], max_file: int = MAX_FILE_BYTES,
                 max_total: int = MAX_BYTES) -> Listing:
    """This node's ``outputs/`` (on the node, inside a worker): each regular file's
    relative path, size and SHA-256, and what is refused (a link, a special file, a size
    over the caps), walked with lstat, never following a link."""
    out: Listing = {"run_dir": run_dir, "files": {}, "refused": []}
    if not run_dir:
        return out
    top = os.path.join(run_dir, "outputs")
    total = 0
    for base, dirs, names in os.walk(top):
        for name in sorted(dirs + names):
            path = os.path.join(base, name)
            rel = os.path.relpath(path, top).replace(os.sep, "/")
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if stat.S_ISDIR(st.st_mode):
                continue
            if stat.S_ISLNK(st.st_mode):
                out["refused"].append(f"outputs/{rel}: a symbolic link")
            elif not stat.S_ISREG(st.st_mode):
                out["refused"].append(f"outputs/{rel}: not a regular file")
            elif is_temp_name(name) or name.startswith("."):
                continue
            elif st.st_size > max_file:
                out["refused"].append(f"outputs/{rel}: {st.st_size} bytes, over the "
                                      f"{max_file} a file may have")
            else:
                total += st.st_size
                out["files"][rel] = [st.st_size, _sha256(path)]
        dirs[:] = sorted(d for d in dirs if not os.path.islink(os.path.join(base, d)))
    if total > max_total:
        out["refused"].append(f"outputs/: {total} bytes in all, over the {max_total} allowed")
    return out


def read_chunk(run_dir: Optional[str], rel: str, offset: int, size: int) -> bytes:
    """``size`` bytes at ``offset`` of ``outputs/<rel>`` on this node (never via a link)."""
    if not run_dir or rel.startswith("/") or ".." in rel.split("/"):
        raise ValueError(f"outputs/{rel}: not a path inside this node's outputs")
    fd = os.open(os.path.join(run_dir, "outputs", rel), os.O_RDONLY | os.O_NOFOLLOW)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ValueError(f"outputs/{rel}: not a regular file")
        os.lseek(fd, offset, os.SEEK_SET)
        return os.read(fd, size)
    finally:
        os.close(fd)


def collect_outputs(head_run_dir: str, listings: List[Listing],
                    read: Callable[[int, str, int, int], bytes]) -> Dict[str, Any]:
    """Copy the files of ``listings`` (one per node; ``read(i, rel, offset, size)`` reads
    from node ``i``) into ``head_run_dir/outputs``; the head's own listing (same run dir)
    is skipped. Returns the facts: files and bytes collected, nodes, and the refusals."""
    facts: Dict[str, Any] = {"files": 0, "bytes": 0, "nodes": 0, "refused": []}
    head = os.path.realpath(head_run_dir)
    dest_top = os.path.join(head, "outputs")
    for i, listing in enumerate(listings):
        run_dir = listing.get("run_dir")
        if not run_dir or os.path.realpath(str(run_dir)) == head:
            continue
        facts["nodes"] += 1
        where = str(listing.get("where") or run_dir)
        if listing.get("refused"):
            facts["refused"] += [f"{where}: {why}; none of its outputs collected"
                                 for why in listing["refused"][:5]]
            continue
        for rel, (size, digest) in sorted(listing.get("files", {}).items()):
            problem = _copy(dest_top, rel, int(size), str(digest), _reader(read, i, rel))
            if problem:
                facts["refused"].append(f"{where}: {problem}")
            else:
                facts["files"] += 1
                facts["bytes"] += int(size)
    return facts


def record_outputs(head_run_dir: str, listings: List[Listing]) -> Dict[str, Any]:
    """``volume.outputs_on_nodes``: the files stay on their nodes; each node's listing
    (where, run directory, relative path -> [size, sha256], what it refused) is written on
    the head as ``outputs/on_nodes/node-<i>.json``, so the evidence checksums the list and
    the list checksums the files. Returns the facts (files and bytes listed, nodes)."""
    facts: Dict[str, Any] = {"files": 0, "bytes": 0, "nodes": 0, "refused": [],
                             "kept_on_nodes": True}
    head = os.path.realpath(head_run_dir)
    for i, listing in enumerate(listings):
        run_dir = listing.get("run_dir")
        if not run_dir or os.path.realpath(str(run_dir)) == head:
            continue
        facts["nodes"] += 1
        files = listing.get("files") or {}
        facts["files"] += len(files)
        facts["bytes"] += sum(int(size) for size, _sha in files.values())
        where = str(listing.get("where") or run_dir)
        facts["refused"] += [f"{where}: {why}" for why in (listing.get("refused") or [])[:5]]
        os.makedirs(os.path.join(head, "outputs", "on_nodes"), exist_ok=True)
        write_json_atomic(os.path.join(head, "outputs", "on_nodes", f"node-{i}.json"),
                          {"where": where, "run_dir": run_dir, "files": files,
                           "refused": listing.get("refused") or []})
    return facts


def _reader(read: Callable[[int, str, int, int], bytes], index: int,
            rel: str) -> Callable[[int, int], bytes]:
    return lambda offset, size: read(index, rel, offset, size)


def _copy(top: str, rel: str, size: int, digest: str,
          read: Callable[[int, int], bytes]) -> Optional[str]:
    if rel.startswith("/") or ".." in rel.split("/"):
        return f"outputs/{rel}: not a path inside outputs/"
    path = os.path.join(top, rel)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    if os.path.realpath(folder) != os.path.normpath(folder):
        return f"outputs/{rel}: its folder on the head leads elsewhere through a link"
    if os.path.lexists(path):
        if not os.path.islink(path) and os.path.isfile(path) and _sha256(path) == digest:
            return None  # already there, the same
        return f"outputs/{rel}: the head holds another file under that name (kept)"
    tmp = os.path.join(folder, f".{os.path.basename(rel)}.{os.getpid()}.collect")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    h, done = hashlib.sha256(), 0
    try:
        with os.fdopen(fd, "wb") as fh:
            while done < size:
                chunk = read(done, min(CHUNK, size - done))
                if not chunk:
                    break
                fh.write(chunk)
                h.update(chunk)
                done += len(chunk)
        if done != size or h.hexdigest() != digest:
            os.remove(tmp)
            return (f"outputs/{rel}: changed while it was collected ({done} of {size} "
                    "bytes, or another SHA-256); left on the node")
        os.replace(tmp, path)
    except BaseException:
        if os.path.lexists(tmp):
            os.remove(tmp)
        raise
    return None


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()
