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

import hashlib
import os
from dataclasses import dataclass, field
from itertools import chain
from typing import IO, Any, Iterator, List, Optional, Tuple

from runner.evidence_shards import INDEX as INDEX  # re-exported: the report reads the index
from runner.evidence_shards import (
    MAX_MEMBER_BYTES,
    SHARD_FILES,
    WORKERS,
    Beat,
    Output,
    no_beat,
    open_regular,
    pack_outputs,
    read_regular,
    scan_outputs,
)
from runner.evidence_show import show_output as show_output
from runner.evidence_store import SUMS as SUMS
from runner.evidence_store import EvidenceError as EvidenceError
from runner.evidence_store import is_url as is_url
from runner.evidence_store import join_dest as join_dest
from runner.evidence_store import open_store
from runner.evidence_verify import REQUIRED
from runner.evidence_verify import VerifyReport as VerifyReport
from runner.evidence_verify import parse_sums as parse_sums
from runner.evidence_verify import verify_evidence as verify_evidence
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


def _put_file(store: Any, rel: str, path: str, sums: List[str], report: EvidenceReport,
              beat: Beat) -> Optional[str]:
    """Stream one of the run's own files into the copy (a MiB at a time, hashed on the
    way: events.jsonl of a million items is never held whole); ``events.jsonl`` up to its
    last complete line as of now (the stage itself still appends to it). The problem, when
    it cannot be read."""
    try:
        fd, st = open_regular(path)
    except FileNotFoundError:
        return f"{rel}: vanished from the run directory during the copy"
    except OSError as exc:
        return f"{rel}: cannot be read ({exc})"
    with os.fdopen(fd, "rb") as fh:
        size = _last_line_end(fh, st.st_size) if rel == "events.jsonl" else st.st_size
        h, left = hashlib.sha256(), size
        with store.create(rel) as out:
            while left:
                chunk = fh.read(min(1 << 20, left))
                if not chunk:
                    break  # it shrank: what there was is copied, and hashed as copied
                out.write(chunk)
                h.update(chunk)
                left -= len(chunk)
                beat(rel)
    sums.append(f"{h.hexdigest()}  {rel}\n")
    report.bytes += size - left
    report.files += 1
    return None


def _last_line_end(fh: IO[bytes], size: int) -> int:
    """Where the last complete line of the first ``size`` bytes ends (0 without one)."""
    end = size
    while end > 0:
        start = max(0, end - (64 << 10))
        fh.seek(start)
        cut = fh.read(end - start).rfind(b"\n")
        if cut >= 0:
            fh.seek(0)
            return start + cut + 1
        end = start
    fh.seek(0)
    return 0


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
            problem = _put_file(store, rel, path, sums, report, beat)
            if problem is not None:
                report.problems.append(problem)
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
        store.prune()
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
