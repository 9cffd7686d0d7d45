"""Evidence: copy a run's results to a place the user controls, then prove the copy.

``copy_evidence`` copies the results (``outputs/``), the balance, the manifest, the spec,
``environment.json`` and ``events.jsonl`` (its complete lines as of now), writes
``SHA256SUMS`` last, then reads every file back from the destination and checks it. A run
with more than ``PLAIN_MAX_FILES`` outputs (or ``PLAIN_MAX_BYTES``) has them packed into
shards with an index (``runner.evidence_shards``), never copied one file at a time.
``verify_evidence`` (``runner.evidence_verify``) re-checks such a folder later, anywhere,
without the original run; ``show_output`` prints one output of it. Destinations are local
(or mounted) directories, or any fsspec URL (``s3://``, ``gs://``, ``memory://``...) when
fsspec and its backend are importable (``runner.evidence_store``). This module is the
contract the bot imports: what it needs of the others is re-exported here. Standard
library only at import time.
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from dataclasses import dataclass, field
from itertools import chain
from typing import Any, BinaryIO, Iterator, List, Optional, Tuple

from runner.evidence_shards import INDEX as INDEX  # re-exported: the report reads the index
from runner.evidence_shards import (
    MAX_MEMBER_BYTES,
    SHARD_FILES,
    WORKERS,
    Beat,
    Output,
    no_beat,
    pack_outputs,
    read_regular,
    scan_outputs,
)
from runner.evidence_store import SUMS as SUMS
from runner.evidence_store import EvidenceError as EvidenceError
from runner.evidence_store import is_url as is_url
from runner.evidence_store import join_dest as join_dest
from runner.evidence_store import open_store
from runner.evidence_verify import REQUIRED, digest_of, parse_sums
from runner.evidence_verify import VerifyReport as VerifyReport
from runner.evidence_verify import verify_evidence as verify_evidence
from runner.shard_index import find_output, read_output
from runner.shard_index import parse_index_line as parse_index_line

TREES = ("event-lists",)  # the full lists events name (events.py); outputs/ apart
# Up to this many outputs (and bytes in all) are copied as plain files, each on its own:
# simpler to read for a pilot's dozen; more are packed into shards.
PLAIN_MAX_FILES = 1000
PLAIN_MAX_BYTES = 256 << 20
# copied (and checksummed) when the run wrote them
OPTIONAL = ("provenance.json", "handler_errors.jsonl")


@dataclass
class EvidenceReport:
    dest: str
    files: int = 0  # plain files and outputs in shards
    bytes: int = 0  # as stored: plain files, shards, index
    verified: bool = False
    problems: List[str] = field(default_factory=list)
    shards: int = 0


def collect(run_dir: str) -> Tuple[List[Tuple[str, str]], List[str]]:
    """The run's own evidence files (relative path, local path) and what is missing; the
    outputs apart (``scan_outputs``: the team's files, walked without following links)."""
    files: List[Tuple[str, str]] = []
    missing: List[str] = []
    for rel in REQUIRED:
        path = os.path.join(run_dir, rel)
        if not os.path.isfile(path):
            missing.append(rel)
            continue
        files.append((rel, path))
    for rel in OPTIONAL:
        path = os.path.join(run_dir, rel)
        if os.path.isfile(path):
            files.append((rel, path))
    for tree in TREES:
        top = os.path.join(run_dir, tree)
        for base, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                if name.startswith("."):
                    continue  # temporary files of an interrupted write
                path = os.path.join(base, name)
                files.append((os.path.relpath(path, run_dir).replace(os.sep, "/"), path))
    return files, missing


def _read_local(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def file_sha256(path: str) -> str:
    """SHA-256 of a file, read in 1 MiB chunks (checkpoints and uploads can be large)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _plain_or_shards(outputs: Iterator[Output], plain_max: int) -> Tuple[List[Output], bool]:
    """The first outputs and whether the run has so many (or so large) that they go into
    shards: the walk is read no further than ``plain_max`` + 1 to decide."""
    head: List[Output] = []
    size = 0
    for item in outputs:
        head.append(item)
        size += item.size
        if len(head) > plain_max or size > PLAIN_MAX_BYTES:
            return head, True
    return head, False


def copy_evidence(run_dir: str, dest: str, beat: Beat = no_beat,
                  plain_max: int = PLAIN_MAX_FILES, workers: int = WORKERS,
                  shard_files: int = SHARD_FILES) -> EvidenceReport:
    """Copy the evidence of ``run_dir`` to ``dest`` (the run's own folder), then verify.

    ``beat(where)`` is called as the copy moves (each file, each member, each MiB): the
    stage is judged by it, not by a fixed time. More than ``plain_max`` outputs go into
    shards of up to ``shard_files`` written ``workers`` at a time."""
    files, missing = collect(run_dir)
    report = EvidenceReport(dest=dest)
    report.problems.extend(f"{rel}: missing in the run directory" for rel in missing)
    store = open_store(dest)
    refused: List[str] = []
    outputs = scan_outputs(run_dir, refused, beat=beat)
    head, sharded = _plain_or_shards(outputs, plain_max)
    sums: List[str] = []
    try:
        try:
            store.remove(SUMS)  # a copy cut midway never verifies against an older list
        except FileNotFoundError:
            pass
        for rel, path in files:
            beat(rel)
            data = _read_local(path)
            if data is None:
                report.problems.append(f"{rel}: vanished from the run directory during the copy")
                continue
            if rel == "events.jsonl":
                data = data[: data.rfind(b"\n") + 1]  # complete lines only, as of now
            _put(store, rel, data, sums, report)
        if sharded:
            packed = pack_outputs(store, chain(head, outputs), beat, workers, shard_files)
            sums.extend(packed.sums)
            report.bytes += packed.bytes
            report.files += packed.members
            report.shards = len(packed.sums) - 1
            report.problems.extend(packed.problems)
        else:
            for item in head:
                beat(item.rel)
                try:
                    data = read_regular(item.path, MAX_MEMBER_BYTES + 1)
                except OSError as exc:
                    report.problems.append(f"{item.rel}: cannot be read ({exc}): left out "
                                           "of the copy")
                    continue
                _put(store, item.rel, data, sums, report)
        keep = {line[66:-1] for line in sums} | {SUMS}
        for rel in store.listing():
            if rel not in keep:
                store.remove(rel)  # left over from an earlier copy of this same run
        store.write(SUMS, "".join(sums).encode("utf-8"))
    except OSError as exc:
        raise EvidenceError(f"results.copy_to {dest}: cannot write: {exc}") from exc
    report.problems[len(missing):len(missing)] = refused
    # read back whole: each shard against the SHA-256 taken of the very bytes written
    # (their members were hashed in the same pass); `preflight verify` and the bot's
    # fetch parse every member again
    check = verify_evidence(dest, beat, workers, members=False)
    report.problems.extend(check.problems)
    report.verified = check.ok and not missing and not report.problems
    return report


def _put(store: Any, rel: str, data: bytes, sums: List[str], report: EvidenceReport) -> None:
    store.write(rel, data)
    sums.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    report.bytes += len(data)
    report.files += 1  # the files listed in SHA256SUMS, as `preflight verify` counts


def show_output(copy: str, item: str, out: BinaryIO) -> str:
    """Write one output of an evidence copy (a folder or a URL) to ``out``, once its bytes
    match the copy's checksum: ``item`` is an output's path (``outputs/...``) or an input
    id, looked up in the copy's balance.csv. Returns the output's path and where it lies;
    raises ``EvidenceError`` naming what is missing or does not match."""
    store = open_store(copy)
    rel = item if item.startswith("outputs/") else _output_of(store, copy, item)
    entry = find_output(store, rel)
    if entry is not None:
        shard, size, digest, offset = entry
        problem = read_output(store, shard, size, digest, offset, out)
        where = f"{rel} (member of {shard})"
    else:
        problem = _show_plain(store, rel, out)
        where = rel
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


def _show_plain(store: Any, rel: str, out: BinaryIO) -> Optional[str]:
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


