"""Evidence: copy a run's results to a place the user controls, then prove the copy.

``copy_evidence`` copies the results (``outputs/``), the balance, the manifest, the spec,
``environment.json`` and ``events.jsonl`` (its complete lines as of now), writes
``SHA256SUMS`` last, then reads every file back from the destination and checks it. A run
with more than ``PLAIN_MAX_FILES`` outputs (or ``PLAIN_MAX_BYTES``) has them packed into
shards with an index (``runner.evidence_shards``), never copied one file at a time.
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
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import chain
from typing import IO, Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Set, Tuple

from runner.errors import RunnerError
from runner.evidence_shards import INDEX as INDEX  # re-exported: the report reads the index
from runner.evidence_shards import (
    MAX_MEMBER_BYTES,
    SHARD_FILES,
    SHARDS,
    WORKERS,
    Beat,
    Output,
    PathSet,
    find_output,
    is_shard,
    pack_outputs,
    read_output,
    read_regular,
    scan_outputs,
    verify_shards,
)
from runner.evidence_shards import parse_index_line as parse_index_line
from runner.files import atomic_open, is_temp_name, write_bytes_atomic

SUMS = "SHA256SUMS"
# What a reader needs to understand the result without the original run.
REQUIRED = ("manifest.yaml", "spec.json", "environment.json", "events.jsonl",
            "balance.json", "balance.csv")
TREES = ("event-lists",)  # the full lists events name (events.py); outputs/ apart
# Up to this many outputs (and bytes in all) are copied as plain files, each on its own:
# simpler to read for a pilot's dozen; more are packed into shards.
PLAIN_MAX_FILES = 1000
PLAIN_MAX_BYTES = 256 << 20
# copied (and checksummed) when the run wrote them
OPTIONAL = ("provenance.json", "handler_errors.jsonl")
# The columns balance.csv must have, and the spec fields that carry the run's parameters.
BALANCE_COLUMNS = ("id", "status", "category", "reason")
MAX_DOC_BYTES = 64 << 20  # spec.json, environment.json, balance.json: JSON read whole
SPEC_FIELDS = ("run_id", "inputs.dir", "inputs.expected_count", "project.params", "task.params",
               "task.kind")


def _no_beat(where: str) -> None:
    return None


class EvidenceError(RunnerError, RuntimeError):
    """The destination cannot be written or read (names it and what to do)."""


@dataclass
class EvidenceReport:
    dest: str
    files: int = 0  # plain files and outputs in shards
    bytes: int = 0  # as stored: plain files, shards, index
    verified: bool = False
    problems: List[str] = field(default_factory=list)
    shards: int = 0


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

    @contextmanager
    def create(self, rel: str) -> Iterator[IO[bytes]]:
        """A file written under a temporary name, fsynced once, renamed when complete."""
        path = os.path.join(self.root, *rel.split("/"))
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with atomic_open(path, binary=True) as fh:
            yield fh

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

    @contextmanager
    def create(self, rel: str) -> Iterator[IO[bytes]]:
        """One object streamed (a multi-part upload on S3, committed when it closes)."""
        path = posixpath.join(self.root, rel)
        self.fs.makedirs(posixpath.dirname(path), exist_ok=True)
        fh = self.fs.open(path, "wb")
        try:
            yield fh
        except BaseException:  # a cut write is dropped, never left under its name
            discard = getattr(fh, "discard", None)
            if callable(discard):
                discard()
            try:
                fh.close()
                self.fs.rm_file(path)
            except (OSError, ValueError):
                pass
            raise
        fh.close()

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


def copy_evidence(run_dir: str, dest: str, beat: Beat = _no_beat,
                  plain_max: int = PLAIN_MAX_FILES, workers: int = WORKERS,
                  shard_files: int = SHARD_FILES) -> EvidenceReport:
    """Copy the evidence of ``run_dir`` to ``dest`` (the run's own folder), then verify.

    ``beat(where)`` is called as the copy moves (each file, each member, each MiB): the
    stage is judged by it, not by a fixed time. More than ``plain_max`` outputs go into
    shards of up to ``shard_files`` written ``workers`` at a time."""
    files, missing = collect(run_dir)
    report = EvidenceReport(dest=dest)
    report.problems.extend(f"{rel}: missing in the run directory" for rel in missing)
    store = _store(dest)
    refused: List[str] = []
    outputs = scan_outputs(run_dir, refused, beat=beat)
    head, sharded = _plain_or_shards(outputs, plain_max)
    sums: List[str] = []
    try:
        if SUMS in store.listing():
            store.remove(SUMS)  # a copy cut midway never verifies against an older list
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
    check = verify_evidence(dest, beat, workers)
    report.problems.extend(check.problems)
    report.verified = check.ok and not missing and not report.problems
    return report


def _put(store: Any, rel: str, data: bytes, sums: List[str], report: EvidenceReport) -> None:
    store.write(rel, data)
    sums.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    report.bytes += len(data)
    report.files += 1  # the files listed in SHA256SUMS, as `preflight verify` counts


def verify_evidence(path: str, beat: Beat = _no_beat, workers: int = WORKERS) -> VerifyReport:
    """Re-read an evidence folder and check every checksum and the required files; with
    shards, every shard once and every output the index lists."""
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
        if is_shard(rel) and INDEX in listed:
            continue  # read once below, with the index
        beat(rel)
        found = _digest(store, rel)  # read in chunks: never a whole file in memory
        if found is None:
            report.problems.append(f"{rel}: missing")
        elif found[0] != digest:
            report.problems.append(f"{rel}: checksum mismatch (content changed)")
        else:
            report.files += 0 if rel == INDEX or is_shard(rel) else 1
            report.bytes += found[1]
            intact.add(rel)
    names = _check_shards(store, listed, intact, report, beat, workers)
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
                  beat: Beat, workers: int) -> PathSet:
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
            found = _digest(store, rel)
            if found is None:
                report.problems.append(f"{rel}: missing")
            elif found[0] != listed[rel]:
                report.problems.append(f"{rel}: checksum mismatch (content changed)")
        report.problems.append(f"{INDEX}: not trusted (see above): the outputs in "
                               f"{SHARDS}/ were not checked one by one")
        return PathSet()
    check = verify_shards(store, listed, beat, workers)
    report.files += check.members
    report.bytes += check.bytes
    report.shards = check.shards
    report.problems.extend(check.problems)
    return check.names


def show_output(copy: str, item: str, out: BinaryIO) -> str:
    """Write one output of an evidence copy (a folder or a URL) to ``out``, once its bytes
    match the copy's checksum: ``item`` is an output's path (``outputs/...``) or an input
    id, looked up in the copy's balance.csv. Returns the output's path and where it lies;
    raises ``EvidenceError`` naming what is missing or does not match."""
    store = _store(copy)
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
    listed, _ = _parse_sums(store.read(SUMS) or b"")
    if rel not in listed:
        return f"{rel}: not in the copy (neither in {SUMS} nor in {INDEX})"
    found = _digest(store, rel)
    if found is None:
        return f"{rel}: missing"
    if found[0] != listed[rel]:
        return f"{rel}: checksum mismatch (content changed)"
    fh = store.open(rel)
    with fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            out.write(chunk)
    return None


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
        out = row.get("output") or ""
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
