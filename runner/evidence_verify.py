"""Verifying an evidence copy, anywhere, without the original run: every file against
``SHA256SUMS``, the shards and their index (``runner.shard_index``), the files needed to
understand the result, the outputs the balance names. Standard library only.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from runner.evidence_shards import INDEX, SHARDS, WORKERS, Beat, no_beat
from runner.evidence_store import SUMS, open_store
from runner.files import is_temp_name
from runner.outputs import file_of
from runner.shard_index import PathSet, is_shard, verify_shards

# What a reader needs to understand the result without the original run.
REQUIRED = ("manifest.yaml", "spec.json", "environment.json", "events.jsonl",
            "balance.json", "balance.csv")
# The columns balance.csv must have, and the spec fields that carry the run's parameters.
BALANCE_COLUMNS = ("id", "status", "category", "reason")
MAX_DOC_BYTES = 64 << 20  # spec.json, environment.json, balance.json: JSON read whole
SPEC_FIELDS = ("run_id", "inputs.dir", "inputs.expected_count", "project.params", "task.params",
               "task.kind")


@dataclass
class VerifyReport:
    path: str
    ok: bool
    files: int = 0
    bytes: int = 0
    problems: List[str] = field(default_factory=list)
    shards: int = 0

    def to_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "files": self.files, "bytes": self.bytes,
                "shards": self.shards, "problems": list(self.problems)}


def verify_evidence(path: str, beat: Beat = no_beat, workers: int = WORKERS,
                    members: bool = True) -> VerifyReport:
    """Re-read an evidence folder and check every checksum and the required files; with
    shards, every shard once and every output the index lists (``members=False``: each
    shard against its own line only, for the copy's read-back of what it just packed)."""
    report = VerifyReport(path=path, ok=False)
    try:
        store = open_store(path)
        raw = store.read(SUMS)
    except OSError as exc:
        report.problems.append(f"{path}: cannot read: {exc}")
        return report
    if raw is None:
        report.problems.append(f"{SUMS}: missing (not an evidence folder, or the copy is "
                               f"incomplete)")
        return report
    listed, bad_lines = parse_sums(raw)
    intact: Set[str] = set()  # read back with the right checksum: safe to look inside
    report.problems.extend(bad_lines)
    for rel, digest in listed.items():
        if is_shard(rel) and INDEX in listed:
            continue  # read once below, with the index
        beat(rel)
        found = digest_of(store, rel)  # read in chunks: never a whole file in memory
        if found is None:
            report.problems.append(f"{rel}: missing")
        elif found[0] != digest:
            report.problems.append(f"{rel}: checksum mismatch (content changed)")
        else:
            report.files += 0 if rel == INDEX or is_shard(rel) else 1
            report.bytes += found[1]
            intact.add(rel)
    names = _check_shards(store, listed, intact, report, beat, workers, members)
    for rel in REQUIRED:
        if rel not in listed:
            report.problems.append(f"{rel}: missing from {SUMS} (needed to understand the "
                                   f"result)")
    for rel in store.listing():
        if rel != SUMS and rel not in listed and not is_temp_name(posixpath.basename(rel)):
            report.problems.append(f"{rel}: present but not listed in {SUMS}")
    report.problems.extend(_check_references(store, listed, names, intact))
    report.problems.extend(_check_context(store, intact))
    report.ok = not report.problems
    return report


def _check_shards(store: Any, listed: Dict[str, str], intact: Set[str], report: VerifyReport,
                  beat: Beat, workers: int, members: bool) -> PathSet:
    """The shards and their index checked (an index that does not match its line is not
    read: its shards are then only checked against their own lines)."""
    if INDEX not in listed:
        report.shards = sum(1 for rel in listed if is_shard(rel))
        if report.shards:
            report.problems.append(f"{INDEX}: missing from {SUMS} while it lists shards: "
                                   "their outputs cannot be checked")
        return PathSet()
    if INDEX not in intact:
        for rel in sorted(r for r in listed if is_shard(r)):
            found = digest_of(store, rel)
            if found is None:
                report.problems.append(f"{rel}: missing")
            elif found[0] != listed[rel]:
                report.problems.append(f"{rel}: checksum mismatch (content changed)")
        report.problems.append(f"{INDEX}: not trusted (see above): the outputs in "
                               f"{SHARDS}/ were not checked one by one")
        return PathSet()
    check = verify_shards(store, listed, beat, workers, members)
    report.files += check.members
    report.bytes += check.bytes
    report.shards = check.shards
    report.problems.extend(check.problems)
    return check.names


def digest_of(store: Any, rel: str) -> Optional[Tuple[str, int]]:
    """SHA-256 and size of one file of the copy, read 1 MiB at a time; None if absent."""
    try:
        fh = store.open(rel)
    except (IsADirectoryError, NotADirectoryError):
        return None
    if fh is None:
        return None
    h, size = hashlib.sha256(), 0
    with fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
            size += len(chunk)
    return h.hexdigest(), size


def parse_sums(raw: bytes) -> Tuple[Dict[str, str], List[str]]:
    listed: Dict[str, str] = {}
    bad: List[str] = []
    for n, line in enumerate(raw.decode("utf-8", errors="replace").splitlines(), 1):
        if not line.strip():
            continue
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel or rel.startswith("/") or ".." in rel.split("/"):
            bad.append(f"{SUMS} line {n}: not '<sha256>  <relative path>'")
            continue
        listed[rel] = digest.lower()
    return listed, bad


def _check_references(store: Any, listed: Dict[str, str], in_shards: PathSet,
                      intact: Set[str]) -> List[str]:
    """Every output the balance names must be in the copy, as a file or in a shard (read
    from balance.csv, which always has one row per input, so a large run is checked line
    by line)."""
    if "balance.csv" not in intact:
        return []
    raw = store.open("balance.csv") or io.BytesIO(b"")
    with io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as text:
        return _references(csv.DictReader(text),
                           lambda rel: rel in listed or rel in in_shards)


def _references(reader: csv.DictReader[str], present: Callable[[str], bool]) -> List[str]:
    """The outputs balance.csv names that are not in the copy, row by row."""
    absent = [c for c in BALANCE_COLUMNS if c not in (reader.fieldnames or [])]
    if absent:
        return [f"balance.csv: no column {', '.join(absent)} (expected at least "
                f"{','.join(BALANCE_COLUMNS)})"]
    problems = []
    for row in reader:
        out = file_of(row.get("output") or "")  # a volume's shard reference: its shard
        if out and not os.path.isabs(out) and not present(out):
            problems.append(f"{out}: named by balance.csv (item {row.get('id')}) but not in "
                            f"the copy")
    return problems


def _check_context(store: Any, listed: Set[str]) -> List[str]:
    """The parameters and references needed to understand the result are really there:
    the manifest is not empty, spec.json names the run and carries its parameters
    (project.params, task.params, inputs), environment.json and balance.json are JSON
    objects, and the balance belongs to the same run as the spec."""
    problems: List[str] = []
    docs: Dict[str, Any] = {}
    for rel in ("spec.json", "environment.json", "balance.json"):
        if rel not in listed:
            continue
        try:
            docs[rel] = json.loads(_head(store, rel, MAX_DOC_BYTES + 1))
        except ValueError:
            docs[rel] = None
        if not isinstance(docs[rel], dict):
            problems.append(f"{rel}: not a JSON object")
    if "manifest.yaml" in listed and not _head(store, "manifest.yaml", MAX_DOC_BYTES).strip():
        problems.append("manifest.yaml: empty (the manifest as submitted is needed)")
    spec = docs.get("spec.json")
    if isinstance(spec, dict):
        for path in SPEC_FIELDS:
            if _dig(spec, path) is None:
                problems.append(f"spec.json: no {path} (needed to understand the result)")
        bal = docs.get("balance.json")
        if isinstance(bal, dict) and bal.get("run") not in (None, spec.get("run_id")):
            problems.append(f"balance.json: run {bal.get('run')!r} is not the spec's run "
                            f"{spec.get('run_id')!r}")
    return problems


def _head(store: Any, rel: str, limit: int) -> bytes:
    """At most ``limit`` bytes of one file of the copy (b"" if absent): a document bigger
    than ``MAX_DOC_BYTES`` is not a run's, and is not read whole to find it out."""
    fh = store.open(rel)
    if fh is None:
        return b""
    with fh:
        data: bytes = fh.read(limit)
    return data


def _dig(doc: Any, path: str) -> Any:
    for key in path.split("."):
        if not isinstance(doc, dict):
            return None
        doc = doc.get(key)
    return doc
