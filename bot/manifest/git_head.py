"""The commit a project directory has checked out, read from its ``.git`` without git.

A project directory is untrusted input: a pilot's fetched results can hold a ``.git``
whose ``HEAD`` says ``ref: ../../../home/bot/.ssh/id_ed25519``, and the commit ends in the
spec that is uploaded to the node. So every file read here stays inside a real ``.git``
directory of the project (or of a folder above it): a ``.git`` that is a symlink, a
``gitdir:`` or ``commondir`` leading out of such a directory, a ref that is not a plain
``refs/…`` name or that resolves (``..``, absolute, symlink) outside the git directory, and
anything that is not a regular file are ignored with a logged warning, never read. Only a
commit-shaped value (40 or 64 hex digits) comes out; anything else is None.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from pathlib import Path

log = logging.getLogger(__name__)

_COMMIT = re.compile(r"^(?:[0-9a-f]{40}|[0-9a-f]{64})$")
_REF = re.compile(r"^refs/(?:[A-Za-z0-9._+@-]+/)*[A-Za-z0-9._+@-]+$")
_SMALL = 4096  # HEAD, a loose ref, a .git file, commondir
_PACKED = 4 * 1024 * 1024  # packed-refs


class _Refused(Exception):
    """A path in the checkout that must not be followed (logged once by git_commit)."""


def git_commit(directory: Path) -> str | None:
    """The commit checked out in ``directory`` or a folder above it, or None when it is not
    a git checkout or its ``.git`` leads anywhere it must not (logged as a warning)."""
    try:
        start = directory.resolve()
    except OSError:
        return None
    for folder in (start, *start.parents):
        dot_git = folder / ".git"
        try:
            mode = os.lstat(dot_git).st_mode
        except OSError:
            continue
        try:
            git_dir = _git_dir(folder, dot_git, mode)
            if git_dir is None:
                continue
            return _head_commit(git_dir, folder)
        except _Refused as exc:
            log.warning("git commit of %s not read: %s", directory, exc)
            return None
        except (OSError, UnicodeDecodeError):
            return None
    return None


def _git_dir(folder: Path, dot_git: Path, mode: int) -> Path | None:
    if stat.S_ISLNK(mode):
        raise _Refused(f"{dot_git} is a symlink")
    if stat.S_ISDIR(mode):
        return dot_git
    if not stat.S_ISREG(mode):
        return None
    text = _read(dot_git, _SMALL).strip()  # a worktree or submodule: "gitdir: <path>"
    if not text.startswith("gitdir:"):
        raise _Refused(f"{dot_git} is a file without a gitdir: line")
    target = (folder / text.removeprefix("gitdir:").strip()).resolve()
    _inside_a_dot_git(target, folder, what=f"{dot_git} (gitdir)")
    return target


def _inside_a_dot_git(path: Path, folder: Path, *, what: str) -> None:
    """Refuse ``path`` unless it is a real ``.git`` directory of ``folder`` or of a folder
    above it, or lies inside one (a submodule's ``../.git/modules/x``)."""
    for above in (folder, *folder.parents):
        dot_git = above / ".git"
        if path == dot_git or path.is_relative_to(dot_git):
            try:
                if stat.S_ISDIR(os.lstat(dot_git).st_mode):
                    return
            except OSError:
                pass
    raise _Refused(f"{what} leads to {path}, outside the project's .git")


def _head_commit(git_dir: Path, folder: Path) -> str | None:
    head = _read(_confined(git_dir, "HEAD"), _SMALL).strip()
    if not head.startswith("ref:"):
        return _commit(head, git_dir / "HEAD")
    ref = head.removeprefix("ref:").strip()
    if not _REF.match(ref) or ".." in ref.split("/"):
        raise _Refused(f"{git_dir / 'HEAD'} names {ref!r}, not a refs/… name")
    common = git_dir
    if (git_dir / "commondir").exists():  # a worktree: refs live in the main .git
        text = _read(_confined(git_dir, "commondir"), _SMALL).strip()
        common = (git_dir / text).resolve()
        _inside_a_dot_git(common, folder, what=f"{git_dir / 'commondir'}")
    for base in (git_dir, common):
        loose = base / ref
        if loose.exists() or loose.is_symlink():
            return _commit(_read(_confined(base, ref), _SMALL).strip(), loose)
    if (common / "packed-refs").exists():
        for line in _read(_confined(common, "packed-refs"), _PACKED).splitlines():
            value, _, name = line.partition(" ")
            if name == ref:
                return _commit(value, common / "packed-refs")
    return None


def _confined(base: Path, relative: str) -> Path:
    """``base/relative`` when it resolves inside ``base`` (no ``..``, no absolute path, no
    symlink leading out), else refused."""
    path = base / relative
    real = path.resolve()
    if not real.is_relative_to(base.resolve()):
        raise _Refused(f"{path} resolves to {real}, outside {base}")
    return path


def _read(path: Path, limit: int) -> str:
    """A regular file's first ``limit`` bytes, opened without following a final symlink."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        if os.path.islink(path):
            raise _Refused(f"{path} is a symlink") from exc
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise _Refused(f"{path} is not a regular file")
        return os.read(fd, limit).decode("utf-8")
    finally:
        os.close(fd)


def _commit(value: str, where: Path) -> str | None:
    if _COMMIT.match(value):
        return value
    log.warning("%s does not hold a commit id; ignored", where)
    return None
