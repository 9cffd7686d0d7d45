"""Evidence: copy a run's results to a place the user controls, then prove the copy.

``copy_evidence`` copies the results (``outputs/``), the balance, the manifest, the spec,
``environment.json`` and ``events.jsonl`` (its complete lines as of now), writes
``SHA256SUMS`` last, then reads every file back from the destination and checks it.
``verify_evidence`` re-checks such a folder later, anywhere, without the original run.
Destinations are local (or mounted) directories, or any fsspec URL (``s3://``, ``gs://``,
``memory://``...) when fsspec and its backend are importable. Standard library only at
import time.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, BinaryIO, Dict, List, Optional, Set, Tuple

from runner.errors import RunnerError
from runner.files import is_temp_name, write_bytes_atomic
from runner.outputs import file_of

SUMS = "SHA256SUMS"
# What a reader needs to understand the result without the original run.
REQUIRED = ("manifest.yaml", "spec.json", "environment.json", "events.jsonl",
            "balance.json", "balance.csv")
TREES = ("outputs", "event-lists")  # event-lists: the full lists events name (events.py)
# copied (and checksummed) when the run wrote them
OPTIONAL = ("provenance.json", "handler_errors.jsonl")
# The columns balance.csv must have, and the spec fields that carry the run's parameters.
BALANCE_COLUMNS = ("id", "status", "category", "reason")
MAX_DOC_BYTES = 64 << 20  # spec.json, environment.json, balance.json: JSON read whole
SPEC_FIELDS = ("run_id", "inputs.dir", "inputs.expected_count", "project.params", "task.params",
               "task.kind")


class EvidenceError(RunnerError, RuntimeError):
    """The destination cannot be written or read (names it and what to do)."""


@dataclass
class EvidenceReport:
    dest: str
    files: int = 0
    bytes: int = 0
    verified: bool = False
    problems: List[str] = field(default_factory=list)


@dataclass
class VerifyReport:
    path: str
    ok: bool
    files: int = 0
    bytes: int = 0
    problems: List[str] = field(default_factory=list)

    def to_dict(self) -> Dict[str, Any]:
        return {"path": self.path, "ok": self.ok, "files": self.files, "bytes": self.bytes,
                "problems": list(self.problems)}


def is_url(dest: str) -> bool:
    return "://" in dest and not dest.startswith("file://")


def join_dest(dest: str, name: str) -> str:
    if is_url(dest):
        return dest.rstrip("/") + "/" + name
    if dest.startswith("file://"):
        dest = dest[len("file://"):]
    return os.path.join(dest, name)


class _Local:
    def __init__(self, root: str) -> None:
        self.root = root

    def write(self, rel: str, data: bytes) -> None:
        path = os.path.join(self.root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_bytes_atomic(path, data)

    def read(self, rel: str) -> Optional[bytes]:
        try:
            with open(os.path.join(self.root, *rel.split("/")), "rb") as fh:
                return fh.read()
        except FileNotFoundError:
            return None

    def open(self, rel: str) -> Optional[BinaryIO]:
        try:
            return open(os.path.join(self.root, *rel.split("/")), "rb")
        except FileNotFoundError:
            return None

    def listing(self) -> List[str]:
        out = []
        for base, _dirs, names in os.walk(self.root):
            for name in names:
                rel = os.path.relpath(os.path.join(base, name), self.root)
                out.append(rel.replace(os.sep, "/"))
        return sorted(out)

    def remove(self, rel: str) -> None:
        os.remove(os.path.join(self.root, *rel.split("/")))


class _Remote:
    def __init__(self, url: str) -> None:
        try:
            import fsspec
        except ImportError as exc:
            raise EvidenceError(
                f"results.copy_to {url}: a URL destination needs the fsspec package and "
                f"its backend on this node (for example: pip install fsspec s3fs)") from exc
        try:
            self.fs, self.root = fsspec.core.url_to_fs(url)
        except (ImportError, ValueError) as exc:
            raise EvidenceError(f"results.copy_to {url}: {exc}") from exc

    def write(self, rel: str, data: bytes) -> None:
        path = posixpath.join(self.root, rel)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        self.fs.pipe_file(path, data)

    def read(self, rel: str) -> Optional[bytes]:
        try:
            return bytes(self.fs.cat_file(posixpath.join(self.root, rel)))
        except FileNotFoundError:
            return None

    def open(self, rel: str) -> Optional[BinaryIO]:
        try:
            fh: BinaryIO = self.fs.open(posixpath.join(self.root, rel), "rb")
        except FileNotFoundError:
            return None
        return fh

    def listing(self) -> List[str]:
        try:
            found = self.fs.find(self.root)
        except FileNotFoundError:
            return []
        root = self.root.rstrip("/") + "/"
        return sorted(p[len(root):] for p in (str(x) for x in found) if p.startswith(root))

    def remove(self, rel: str) -> None:
        self.fs.rm_file(posixpath.join(self.root, rel))


def _store(dest: str) -> Any:
    if is_url(dest):
        return _Remote(dest)
    if dest.startswith("file://"):
        dest = dest[len("file://"):]
    return _Local(dest)


def collect(run_dir: str) -> Tuple[List[Tuple[str, str]], List[str]]:
    """The evidence files of a run (relative path, local path) and what is missing.

    Contents are read one file at a time when copied, so a run with a million outputs
    is copied without holding them all in memory.
    """
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


def copy_evidence(run_dir: str, dest: str) -> EvidenceReport:
    """Copy the evidence of ``run_dir`` to ``dest`` (the run's own folder), then verify."""
    files, missing = collect(run_dir)
    report = EvidenceReport(dest=dest)
    report.problems.extend(f"{rel}: missing in the run directory" for rel in missing)
    store = _store(dest)
    sums: List[str] = []
    try:
        for rel, path in files:
            data = _read_local(path)
            if data is None:
                report.problems.append(f"{rel}: vanished from the run directory during the copy")
                continue
            if rel == "events.jsonl":
                data = data[: data.rfind(b"\n") + 1]  # complete lines only, as of now
            store.write(rel, data)
            sums.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
            report.bytes += len(data)
        keep = {line[66:-1] for line in sums} | {SUMS}
        for rel in store.listing():
            if rel not in keep:
                store.remove(rel)  # left over from an earlier copy of this same run
        store.write(SUMS, "".join(sums).encode("utf-8"))
    except OSError as exc:
        raise EvidenceError(f"results.copy_to {dest}: cannot write: {exc}") from exc
    report.files = len(sums)  # the files listed in SHA256SUMS, as `preflight verify` counts
    check = verify_evidence(dest)
    report.problems.extend(check.problems)
    report.verified = check.ok and not missing and not report.problems
    return report


def verify_evidence(path: str) -> VerifyReport:
    """Re-read an evidence folder and check every checksum and the required files."""
    report = VerifyReport(path=path, ok=False)
    try:
        store = _store(path)
        raw = store.read(SUMS)
    except OSError as exc:
        report.problems.append(f"{path}: cannot read: {exc}")
        return report
    if raw is None:
        report.problems.append(f"{SUMS}: missing (not an evidence folder, or the copy is "
                               f"incomplete)")
        return report
    listed, bad_lines = _parse_sums(raw)
    intact: Set[str] = set()  # read back with the right checksum: safe to look inside
    report.problems.extend(bad_lines)
    for rel, digest in listed.items():
        found = _digest(store, rel)  # read in chunks: never a whole file in memory
        if found is None:
            report.problems.append(f"{rel}: missing")
        elif found[0] != digest:
            report.problems.append(f"{rel}: checksum mismatch (content changed)")
        else:
            report.files += 1
            report.bytes += found[1]
            intact.add(rel)
    for rel in REQUIRED:
        if rel not in listed:
            report.problems.append(f"{rel}: missing from {SUMS} (needed to understand the "
                                   f"result)")
    for rel in store.listing():
        if rel != SUMS and rel not in listed and not is_temp_name(posixpath.basename(rel)):
            report.problems.append(f"{rel}: present but not listed in {SUMS}")
    report.problems.extend(_check_references(store, listed, intact))
    report.problems.extend(_check_context(store, intact))
    report.ok = not report.problems
    return report


def _digest(store: Any, rel: str) -> Optional[Tuple[str, int]]:
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


def _parse_sums(raw: bytes) -> Tuple[Dict[str, str], List[str]]:
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


def _check_references(store: Any, listed: Dict[str, str], intact: Set[str]) -> List[str]:
    """Every output the balance names must be in the copy (read from balance.csv, which
    always has one row per input, so a large run is checked line by line)."""
    if "balance.csv" not in intact:
        return []
    raw = store.open("balance.csv") or io.BytesIO(b"")
    with io.TextIOWrapper(raw, encoding="utf-8", errors="replace", newline="") as text:
        return _references(csv.DictReader(text), listed)


def _references(reader: csv.DictReader[str], listed: Dict[str, str]) -> List[str]:
    """The outputs balance.csv names that are not in the copy, row by row."""
    absent = [c for c in BALANCE_COLUMNS if c not in (reader.fieldnames or [])]
    if absent:
        return [f"balance.csv: no column {', '.join(absent)} (expected at least "
                f"{','.join(BALANCE_COLUMNS)})"]
    problems = []
    for row in reader:
        out = file_of(row.get("output") or "")  # a shard reference: its shard
        if out and not os.path.isabs(out) and out not in listed:
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
