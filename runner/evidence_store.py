"""Where an evidence copy lives: a local (or mounted) folder or any fsspec URL
(``s3://``, ``gs://``, ``memory://``...), behind one small interface: ``write`` (atomic),
``create`` (a file streamed, whole or not at all), ``read``, ``open``, ``listing``,
``remove``. Standard library only at import time (fsspec imported for a URL).
"""

from __future__ import annotations

import os
import posixpath
from contextlib import contextmanager
from typing import IO, Any, BinaryIO, Iterator, List, Optional

from runner.errors import RunnerError
from runner.files import atomic_open, write_bytes_atomic

SUMS = "SHA256SUMS"


class EvidenceError(RunnerError, RuntimeError):
    """The destination cannot be written or read (names it and what to do)."""


def is_url(dest: str) -> bool:
    return "://" in dest and not dest.startswith("file://")


def join_dest(dest: str, name: str) -> str:
    if is_url(dest):
        return dest.rstrip("/") + "/" + name
    if dest.startswith("file://"):
        dest = dest[len("file://"):]
    return os.path.join(dest, name)


class LocalStore:
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

    def prune(self) -> None:
        """Remove the folders an earlier copy left empty (its plain outputs/, say)."""
        for base, _dirs, _names in os.walk(self.root, topdown=False):
            try:
                if base != self.root and not os.listdir(base):  # its empty folders gone
                    os.rmdir(base)
            except OSError:
                pass


class RemoteStore:
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

    def prune(self) -> None:
        """Nothing to do: an object store has no empty folders to leave."""


def open_store(dest: str) -> Any:
    """The store of an evidence copy at ``dest`` (a folder or a URL)."""
    if is_url(dest):
        return RemoteStore(dest)
    if dest.startswith("file://"):
        dest = dest[len("file://"):]
    return LocalStore(dest)


