"""Opening one output of an evidence copy (``preflight evidence show``): by its path, or
by an input's id through the copy's ``balance.csv``; from a plain file, a shard member
(``runner.shard_index``), or one line of a volume's JSONL output file
(``outputs/shards/<name>.jsonl#<line>``, ``runner.outputs``). Nothing is written before
its bytes match the copy's checksum. Standard library only.
"""

from __future__ import annotations

import csv
import io
import json
import os
from typing import Any, BinaryIO, List, Optional

from runner.evidence_shards import INDEX
from runner.evidence_store import SUMS, EvidenceError, open_store
from runner.evidence_verify import digest_of, parse_sums
from runner.outputs import MAX_LINE_BYTES, parse_ref
from runner.shard_index import Sink, find_output, read_output


def show_output(copy: str, item: str, out: BinaryIO) -> str:
    """Write one output of an evidence copy (a folder or a URL) to ``out``, once its bytes
    match the copy's checksum: ``item`` is an output's path (``outputs/...``) or an input
    id, looked up in the copy's balance.csv. Returns the output's path and where it lies;
    raises ``EvidenceError`` naming what is missing or does not match."""
    store = open_store(copy)
    rel = item if item.startswith("outputs/") else _output_of(store, copy, item)
    line = parse_ref(rel)
    if line is not None:  # one line of a volume's JSONL output file
        picked = _Line(line.line)
        where = _copy_file(store, copy, line.path, picked)
        out.write(picked.output(copy, line.path, item))
        return f"{line.path} line {line.line}" + where[len(line.path):]
    return rel + _copy_file(store, copy, rel, out)


def _copy_file(store: Any, copy: str, rel: str, out: Sink) -> str:
    """One file of the copy (plain or a shard member) to ``out``, checked first; says
    where it lay beyond its path."""
    entry = find_output(store, rel)
    if entry is not None:
        shard, size, digest, offset = entry
        problem = read_output(store, shard, size, digest, offset, out)
        where = f" (member of {shard})"
    else:
        problem = _show_plain(store, rel, out)
        where = ""
    if problem is not None:
        raise EvidenceError(f"{copy}: {problem}")
    return where


def _output_of(store: Any, copy: str, item: str) -> str:
    """The output balance.csv names for input ``item`` (read row by row)."""
    raw = store.open("balance.csv")
    if raw is None:
        raise EvidenceError(f"{copy}: no balance.csv to find input {item!r} in (name the "
                            "output as outputs/...)")
    with io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as text:
        for row in csv.DictReader(text):
            if row.get("id") != item:
                continue
            out = row.get("output") or ""
            if not out or os.path.isabs(out):
                raise EvidenceError(f"{copy}: input {item!r} has no output in the copy "
                                    f"(status {row.get('status')}, reason "
                                    f"{row.get('reason') or '-'}, output {out or '-'})")
            return out
    raise EvidenceError(f"{copy}: no input {item!r} in balance.csv (an output is named "
                        "outputs/...)")


def _show_plain(store: Any, rel: str, out: Sink) -> Optional[str]:
    """A plain output's bytes to ``out`` once its SHA256SUMS line matches (two reads)."""
    listed, _ = parse_sums(store.read(SUMS) or b"")
    if rel not in listed:
        return f"{rel}: not in the copy (neither in {SUMS} nor in {INDEX})"
    found = digest_of(store, rel)
    if found is None:
        return f"{rel}: missing"
    if found[0] != listed[rel]:
        return f"{rel}: checksum mismatch (content changed)"
    fh = store.open(rel)
    with fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            out.write(chunk)
    return None


class _Line:
    """Keeps line ``number`` (from 1) of what is written to it, at most one output's
    worth of bytes (``MAX_LINE_BYTES``)."""

    def __init__(self, number: int) -> None:
        self.number, self.seen, self.kept = number, 1, 0
        self.parts: List[bytes] = []

    def write(self, chunk: bytes) -> int:
        pos = 0
        while pos < len(chunk) and self.seen <= self.number:
            cut = chunk.find(b"\n", pos)
            end = len(chunk) if cut < 0 else cut + 1
            if self.seen == self.number and self.kept < MAX_LINE_BYTES:
                part = chunk[pos:min(end, pos + MAX_LINE_BYTES - self.kept)]
                self.parts.append(part)
                self.kept += len(part)
            if cut < 0:
                break
            self.seen += 1
            pos = end
        return len(chunk)

    def output(self, copy: str, path: str, item: str) -> bytes:
        """The line's output as indented JSON, once the line is the input's own."""
        if self.seen < self.number and not self.parts:
            raise EvidenceError(f"{copy}: {path} has no line {self.number}")
        try:
            doc = json.loads(b"".join(self.parts))
        except ValueError as exc:
            raise EvidenceError(f"{copy}: {path} line {self.number}: not JSON "
                                f"({exc})") from exc
        if not isinstance(doc, dict) or (not item.startswith("outputs/")
                                         and doc.get("id") != item):
            got = doc.get("id") if isinstance(doc, dict) else None
            raise EvidenceError(f"{copy}: {path} line {self.number} holds the output of "
                                f"{got!r}, not of {item!r}")
        return (json.dumps(doc.get("output"), indent=2, sort_keys=True, ensure_ascii=False)
                + "\n").encode("utf-8")
