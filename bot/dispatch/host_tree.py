"""Writes on the bot host that stay inside one folder: the fetch's staging folders, a run
directory, an evidence home.

A ``HostDir`` is a folder opened once (``O_DIRECTORY | O_NOFOLLOW``); every create,
replace and remove below it is made relative to its descriptor, one checked component at
a time, each folder on the way opened ``O_NOFOLLOW``. A name that is not one plain path
component (``..``, a ``/``, empty) or a link on the way raises ``OSError`` before anything
is written: nothing outside the folder is created, replaced or removed, whatever a name
that came from a node says (``bot/dispatch/node_names.py`` checks those first, naming the
node).
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
from collections.abc import Sequence
from pathlib import Path

DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def _plain(name: str) -> str:
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise OSError(errno.EINVAL, f"not one plain path component: {name!r}")
    return name


class HostDir:
    """A folder of the bot host, held by its descriptor; use as a context manager."""

    def __init__(self, path: Path, *, create: bool = False) -> None:
        self.path = path
        if create:
            path.mkdir(parents=True, exist_ok=True)
        self.fd = os.open(path, DIR_FLAGS)

    def __enter__(self) -> HostDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    # -- below it ----------------------------------------------------------------------
    def _parent(self, parts: Sequence[str]) -> int:
        """A new descriptor of the folder holding ``parts[-1]``, walked from this one."""
        fd = os.dup(self.fd)
        try:
            for part in parts[:-1]:
                nxt = os.open(_plain(part), DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = nxt
        except BaseException:
            os.close(fd)
            raise
        _plain(parts[-1])
        return fd

    def mkdir(self, parts: Sequence[str], mode: int = 0o755) -> None:
        """A new folder (it must not exist)."""
        fd = self._parent(parts)
        try:
            os.mkdir(parts[-1], mode, dir_fd=fd)
        finally:
            os.close(fd)

    def create(self, parts: Sequence[str], mode: int = 0o644, *,
               replace: bool = False) -> int:
        """A new file opened for writing (``O_EXCL | O_NOFOLLOW``): its descriptor.
        ``replace``: what was at that name (a file, a link, a folder) removed first."""
        fd = self._parent(parts)
        try:
            if replace:
                _remove_at(fd, parts[-1])
            return os.open(parts[-1], os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                           mode, dir_fd=fd)
        finally:
            os.close(fd)

    def ensure_dir(self, parts: Sequence[str], mode: int = 0o755) -> None:
        """The folder ``parts`` there, made if missing (what else was at its name removed
        first): a kept staging folder is filled again without being emptied."""
        fd = self._parent(parts)
        try:
            try:
                if stat.S_ISDIR(os.lstat(parts[-1], dir_fd=fd).st_mode):
                    return
                _remove_at(fd, parts[-1])
            except FileNotFoundError:
                pass
            os.mkdir(parts[-1], mode, dir_fd=fd)
        finally:
            os.close(fd)

    def unlink(self, parts: Sequence[str]) -> None:
        """The entry ``parts`` (a file, a link or a folder) gone, if it was there."""
        fd = self._parent(parts)
        try:
            _remove_at(fd, parts[-1])
        finally:
            os.close(fd)

    def remove(self, name: str) -> None:
        """``name`` (a file, a link or a whole folder, never followed) gone, if it was there."""
        _remove_at(self.fd, _plain(name))

    def kept(self, name: str) -> HostDir:
        """``name`` opened as it is, made when missing (what else was there removed): the
        caller closes it."""
        self.ensure_dir((name,))
        return HostDir.below(self, name)

    def fresh(self, name: str) -> HostDir:
        """``name`` made anew (what was there removed) and opened: the caller closes it."""
        self.remove(name)
        os.mkdir(_plain(name), 0o755, dir_fd=self.fd)
        return HostDir.below(self, name)

    @classmethod
    def below(cls, parent: HostDir, name: str) -> HostDir:
        """The folder ``name`` of ``parent``, opened without following a link."""
        out = cls.__new__(cls)
        out.path = parent.path / _plain(name)
        out.fd = os.open(name, DIR_FLAGS, dir_fd=parent.fd)
        return out

    def replace_into(self, name: str, dest: HostDir, dest_name: str) -> None:
        """Move ``name`` from here to ``dest_name`` in ``dest``, what was there removed
        first (a folder is never merged into another)."""
        src = _plain(name)
        dst = _plain(dest_name)
        try:
            kind = stat.S_IFMT(os.lstat(dst, dir_fd=dest.fd).st_mode)
        except FileNotFoundError:
            kind = None
        moving = stat.S_IFMT(os.lstat(src, dir_fd=self.fd).st_mode)
        if kind is not None and (kind == stat.S_IFDIR or kind != moving):
            dest.remove(dst)
        os.replace(src, dst, src_dir_fd=self.fd, dst_dir_fd=dest.fd)


def _remove_at(fd: int, name: str) -> None:
    try:
        st = os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=fd)
    else:
        os.unlink(name, dir_fd=fd)
