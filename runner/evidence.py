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

import hashlib
import json
import os
import posixpath
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

SUMS = "SHA256SUMS"
# What a reader needs to understand the result without the original run.
REQUIRED = ("manifest.yaml", "spec.json", "environment.json", "events.jsonl",
            "balance.json", "balance.csv")
TREES = ("outputs",)


class EvidenceError(RuntimeError):
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
        tmp = path + ".part"
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)

    def read(self, rel: str) -> Optional[bytes]:
        try:
            with open(os.path.join(self.root, *rel.split("/")), "rb") as fh:
                return fh.read()
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


def collect(run_dir: str) -> Tuple[List[Tuple[str, bytes]], List[str]]:
    """The evidence files of a run (relative path, content) and what is missing."""
    files: List[Tuple[str, bytes]] = []
    missing: List[str] = []
    for rel in REQUIRED:
        data = _read_local(os.path.join(run_dir, rel))
        if data is None:
            missing.append(rel)
            continue
        if rel == "events.jsonl":
            data = data[: data.rfind(b"\n") + 1]  # complete lines only, as of now
        files.append((rel, data))
    for tree in TREES:
        top = os.path.join(run_dir, tree)
        for base, dirs, names in os.walk(top):
            dirs.sort()
            for name in sorted(names):
                if name.startswith("."):
                    continue  # temporary files of an interrupted write
                path = os.path.join(base, name)
                data = _read_local(path)
                if data is not None:
                    files.append((os.path.relpath(path, run_dir).replace(os.sep, "/"), data))
    return files, missing


def _read_local(path: str) -> Optional[bytes]:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except (FileNotFoundError, IsADirectoryError):
        return None


def sums_text(files: List[Tuple[str, bytes]]) -> str:
    return "".join(f"{hashlib.sha256(data).hexdigest()}  {rel}\n" for rel, data in files)


def copy_evidence(run_dir: str, dest: str) -> EvidenceReport:
    """Copy the evidence of ``run_dir`` to ``dest`` (the run's own folder), then verify."""
    files, missing = collect(run_dir)
    report = EvidenceReport(dest=dest)
    report.problems.extend(f"{rel}: missing in the run directory" for rel in missing)
    store = _store(dest)
    try:
        for rel, data in files:
            store.write(rel, data)
        keep = {rel for rel, _ in files} | {SUMS}
        for rel in store.listing():
            if rel not in keep:
                store.remove(rel)  # left over from an earlier copy of this same run
        store.write(SUMS, sums_text(files).encode("utf-8"))
    except OSError as exc:
        raise EvidenceError(f"results.copy_to {dest}: cannot write: {exc}") from exc
    report.files = len(files) + 1
    report.bytes = sum(len(d) for _, d in files)
    check = verify_evidence(dest)
    report.problems.extend(check.problems)
    report.verified = check.ok and not missing
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
    report.problems.extend(bad_lines)
    for rel, digest in listed.items():
        data = store.read(rel)
        if data is None:
            report.problems.append(f"{rel}: missing")
        elif hashlib.sha256(data).hexdigest() != digest:
            report.problems.append(f"{rel}: checksum mismatch (content changed)")
        else:
            report.files += 1
            report.bytes += len(data)
    for rel in REQUIRED:
        if rel not in listed:
            report.problems.append(f"{rel}: missing from {SUMS} (needed to understand the "
                                   f"result)")
    for rel in store.listing():
        if rel != SUMS and rel not in listed and not rel.endswith(".part"):
            report.problems.append(f"{rel}: present but not listed in {SUMS}")
    report.problems.extend(_check_references(store, listed))
    report.ok = not report.problems
    return report


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


def _check_references(store: Any, listed: Dict[str, str]) -> List[str]:
    """Every output the balance names must be in the copy."""
    if "balance.json" not in listed:
        return []
    data = store.read("balance.json")
    try:
        doc = json.loads(data or b"")
    except ValueError:
        return ["balance.json: not valid JSON"]
    problems = []
    for row in doc.get("rows", []) if isinstance(doc, dict) else []:
        out = row.get("output") if isinstance(row, dict) else None
        if isinstance(out, str) and not os.path.isabs(out) and out not in listed:
            problems.append(f"{out}: named by balance.json (item {row.get('id')}) but not in "
                            f"the copy")
    return problems
