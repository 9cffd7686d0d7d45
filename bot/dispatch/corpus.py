"""A volume's corpus already on its nodes (``volume.inputs.on_nodes``): checked, used in place.

A million inputs are not sent to every node when the team has them there already (copied
beforehand, or on storage every node mounts at the same path). The manifest names that
path in ``volume.inputs.on_nodes``; ``volume.inputs.dir`` stays the bot's own copy, which
the manifest's checks list (``pattern``, ``expected_count``, ``expected_refusals``) and
which the submission records (``inputs.checked.json``). At dispatch each node lists its
copy with the runner's rule and checksums every file (``corpus_listing.py``, run with the
node's interpreter); its listing's digest must equal the one of the bot's copy (name, size
and SHA-256 of each file, in name order), or the node is refused, naming it and the first
input that differs. Nothing of the corpus is uploaded; the node's spec reads its inputs
from ``on_nodes``.

Without ``volume.inputs.dir`` the corpus is only on the nodes: the bot has no copy, the
head node lists it first (``corpus_head.py``, written to ``LISTING_FILE``) and every node's
listing must equal the head's.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shlex
import threading
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle, first_difference, json_object
from bot.dispatch.inputs_check import CheckedInputs, checked_files
from bot.dispatch.node_names import node_name
from bot.dispatch.node_output import NODE_OUTPUT_CAP
from bot.dispatch.plan import plan_of
from bot.errors import DispatchError
from bot.node_programs import NODE_CORPUS_SCRIPT
from bot.node_programs.corpus_listing import Row, listing_digest
from runner.inputs import item_id


def corpus_on_nodes(handle: RunHandle, spec: dict[str, Any]) -> str | None:
    """``volume.inputs.on_nodes`` of a volume run (its launch plan's; None: the corpus is
    sent, or the run is no volume)."""
    return plan_of(handle).on_nodes if spec.get("volume") else None


def corpus_node_only(handle: RunHandle, spec: dict[str, Any]) -> bool:
    """The corpus is only on the nodes: ``on_nodes`` without ``volume.inputs.dir`` (the
    bot has no copy; the head node's listing is the reference, ``LISTING_FILE``)."""
    return bool(spec.get("volume")) and plan_of(handle).node_only


# The head node's listing of a corpus only the nodes hold, written at each dispatch
# (bot/dispatch/corpus_head.py): the rows every other node must equal, and the ids. JSON
# Lines: a header (node, on_nodes, pattern, digest, count, bytes), then one row a line, so
# a million rows are written and read a line at a time, never held as one document.
LISTING_FILE = "corpus.listed.jsonl"


def write_listing(run_dir: Path, header: dict[str, Any], rows: Iterable[Row]) -> None:
    """``LISTING_FILE``, whole or not at all (a temporary name, fsync, rename)."""
    final = run_dir / LISTING_FILE
    tmp = final.with_name(f".{LISTING_FILE}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(json.dumps(header) + "\n")
            for row in rows:
                fh.write(json.dumps(list(row)) + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)


def listing_header(run_dir: Path) -> dict[str, Any]:
    """The header of the head's listing (its first line): node, digest, count..."""
    path = run_dir / LISTING_FILE
    try:
        with open(path, encoding="utf-8") as fh:
            header = json.loads(fh.readline())
    except (OSError, ValueError) as exc:
        raise DispatchError(f"{path}: the head node's listing of volume.inputs.on_nodes "
                            f"cannot be read: {exc}") from exc
    if not isinstance(header, dict) or not isinstance(header.get("digest"), str):
        raise DispatchError(f"{path}: the head node's listing has no header")
    return header


def iter_head_rows(run_dir: Path) -> Iterator[Row]:
    """The rows of the head's listing (``LISTING_FILE``) this dispatch wrote, a line at a
    time."""
    path = run_dir / LISTING_FILE
    try:
        with open(path, encoding="utf-8") as fh:
            fh.readline()
            for line in fh:
                name, size, sha = json.loads(line)
                yield str(name), int(size), str(sha)
    except (OSError, ValueError, TypeError) as exc:
        raise DispatchError(f"{path}: the head node's listing of volume.inputs.on_nodes "
                            f"cannot be read: {exc}") from exc


def head_rows(run_dir: Path) -> list[Row]:
    """Every row of the head's listing (the first difference of a node's copy needs them)."""
    return list(iter_head_rows(run_dir))


def head_node(run_dir: Path) -> str:
    """Where the head's listing was made (``user@host:port``)."""
    return str(listing_header(run_dir).get("node") or "volume.nodes[0]")


@dataclass(frozen=True)
class Reference:
    """What a node's listing must equal: its digest and count, the rows only when needed
    (a node whose copy differs is told its first differing input)."""

    digest: str
    count: int
    rows: Callable[[], list[Row]]

    @classmethod
    def of(cls, rows: list[Row]) -> Reference:
        """The reference of rows already in memory (the bot's own copy)."""
        return cls(listing_digest(rows), len(rows), lambda: rows)


def expected_rows(files: dict[str, tuple[Path, str]]) -> list[Row]:
    """The bot's copy as the node lists its own: (name, size, sha256) in name order."""
    return [(name, os.stat(path).st_size, digest) for name, (path, digest)
            in sorted(files.items())]


# The bot's copy hashed once for every node of a dispatch (ten nodes, one read of a
# terabyte, not ten), keyed by each file's path, size, mtime and inode: a file changed
# since is hashed again. A few corpora at most are kept.
_ROWS: dict[tuple[Any, ...], list[Row]] = {}
_ROWS_KEPT = 4
_rows_lock = threading.Lock()


def reference_rows(inputs: CheckedInputs) -> list[Row]:
    """``expected_rows`` of the checked inputs (each read without following a link),
    hashed once while their files are unchanged."""
    key = tuple(sorted((name, str(path), *_signature(path))
                       for name, path in inputs.files.items()))
    with _rows_lock:
        if key in _ROWS:
            return _ROWS[key]
    rows = expected_rows(checked_files(inputs))
    with _rows_lock:
        while len(_ROWS) >= _ROWS_KEPT:
            _ROWS.pop(next(iter(_ROWS)))
        _ROWS[key] = rows
    return rows


def _signature(path: Path) -> tuple[int, int, int]:
    try:
        st = os.stat(path)
    except OSError:
        return (-1, -1, -1)  # checked_files names it
    return (st.st_size, st.st_mtime_ns, st.st_ino)


def listing_cap(inputs: int) -> int:
    """The most a node's listing of ``inputs`` files may print: 1 KiB a row (a name of 255
    bytes, JSON-escaped, its size and digest) over 4 MiB; the bot reads no more of it."""
    return NODE_OUTPUT_CAP + 1024 * max(0, inputs)


def node_row(row: Any, where: str, folder: str) -> Row:
    """One row of a node's listing, type-checked: ``[name, size, sha256]`` with a plain
    name (``node_name``), a non-negative integer size and a digest (a string, compared
    only); a DispatchError naming the node otherwise."""
    if not (isinstance(row, list) and len(row) == 3 and isinstance(row[1], int)
            and not isinstance(row[1], bool) and row[1] >= 0 and isinstance(row[2], str)
            and len(row[2]) <= 128):
        raise DispatchError(f"{where}: the listing of {folder} holds {str(row)[:200]!r}, "
                            "not [name, size, sha256]: the node's answer is refused")
    return node_name(row[0], where, folder), row[1], row[2]


def node_rows(files: Any, where: str, folder: str) -> list[Row]:
    """Rows of a node's listing given as one list (``node_row`` each)."""
    return [node_row(row, where, folder)
            for row in (files if isinstance(files, list) else [files] if files else [])]


def listing_answer(out: str, where: str, folder: str) -> tuple[dict[str, Any] | None,
                                                               Iterator[Row]]:
    """A node's listing as it prints it (``corpus_listing.main``): its header line (count
    and digest, or error; None: not a listing) and its rows, one a line, checked as they
    are read."""
    lines = io.StringIO(out)
    header = json_object(lines.readline())

    def rows() -> Iterator[Row]:
        for number, line in enumerate(lines, start=2):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError:
                raise DispatchError(f"{where}: line {number} of the listing of {folder} is "
                                    f"not JSON ({line.strip()[:200]!r}): the node's answer "
                                    "is refused") from None
            yield node_row(row, where, folder)

    return header, rows()


def corpus_command(python: str, on_nodes: str, pattern: str, digest: str,
                   workdir: str = "") -> str:
    """The node's listing of ``on_nodes``: prints its digest (and its rows if it is not
    ``digest``, the reference's);
    with ``workdir``, the node remembers the digests there (``corpus-<tag>.json``, read
    again only for files whose stat changed)."""
    tag = hashlib.sha256(f"{on_nodes}\0{pattern}".encode()).hexdigest()[:16]
    cache = f"{workdir.rstrip('/')}/cache/corpus-{tag}.json" if workdir else ""
    return " ".join(shlex.quote(a) for a in (python, "-c", NODE_CORPUS_SCRIPT, on_nodes,
                                             pattern, digest, cache))


def check_listing(where: str, on_nodes: str, reference: Reference, reply: str, *,
                  head: str | None = None) -> None:
    """The node's answer against ``reference`` (the bot's copy, or the head node's listing
    of a corpus only the nodes hold, listed on ``head``); a DispatchError naming the node
    and the first input (by id) that differs."""
    against = f"the head node {head}'s listing" if head else "the bot's volume.inputs.dir"
    refuse = (f"{where}: its copy of the corpus at volume.inputs.on_nodes {on_nodes} differs "
              f"from {against}")
    again = ("; the volume is not started on a corpus other than the one checked: make the "
             "node's copy equal (or drop on_nodes to have it sent)" if head is None else
             "; the volume is not started on nodes whose corpora differ: make every node's "
             "copy equal to the head's (volume.nodes[0])")
    answer, their_rows = listing_answer(reply, where, on_nodes)
    if answer is None:
        raise DispatchError(f"{where}: the listing of volume.inputs.on_nodes {on_nodes} "
                            f"printed {reply.strip()[:200]!r}")
    if answer.get("error"):
        raise DispatchError(f"{where}: volume.inputs.on_nodes {on_nodes} cannot be listed "
                            f"on the node ({answer['error']}){again}")
    if answer.get("digest") == reference.digest:
        return
    theirs = {n: (size, sha) for n, size, sha in their_rows}
    ours = {name: (size, sha) for name, size, sha in reference.rows()}
    first = first_difference(ours, theirs, key=lambda n: (item_id(n), n))
    if first is not None:
        name, how = first
        if how == "missing":
            why = f"{name} is missing on the node"
        elif how == "extra":
            why = f"{name} is on the node, not in " + (against if head else "the bot's copy")
        else:
            why = f"{name}: its {'size' if theirs[name][0] != ours[name][0] else 'SHA-256'} differs"
        raise DispatchError(f"{refuse}: first differing input {item_id(name)!r} ({why}){again}")
    raise DispatchError(f"{refuse}: its listing's digest differs ({answer.get('count')} "
                        f"file(s) there, {reference.count} here){again}")
