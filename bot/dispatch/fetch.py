"""Bringing a finished SSH run's results back: retried after a drop, never half-verified,
and never trusted.

The remote run directory is copied into ``<run dir>/.fetch/`` and the evidence copy into
``<copy_to>/.fetch-<run id>/``; only a complete copy is moved into place, so a drop in the
middle leaves what was there before, never a half copy under the final name. A drop is
retried (the dispatcher's ``attempts``, with its backoff); the evidence is verified only
once its copy is complete (``verify_fetched``).

What comes back is written by the team's code, so it is untrusted (docs/security.md, "What
comes back from a node"). The copy is walked here, not by ``sftp.get(recurse=True)``
(which recreates the node's symbolic links on the bot host): each entry is looked at with
``lstat`` on the node and only regular files and folders are copied; anything else (a
symbolic link, a FIFO, a device, a socket) refuses the whole fetch, naming the path and the
run. Each file is created new in the staging folder (``O_EXCL | O_NOFOLLOW``), its bytes
counted against ``FetchLimits`` (per file and in all) as they arrive: a fetch over either
cap fails and replaces nothing. The bot's own files of the run directory (``BOT_FILES``:
its spec, manifest, ``remote.json``…) are never replaced by the node's copy.
"""

from __future__ import annotations

import asyncio
import errno
import os
import posixpath
import shutil
import stat
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bot.dispatch.base import RunHandle
from bot.dispatch.transfer import Meter, current_meter
from bot.dispatch.upload import Backoff, SSHNode, verify_fetched
from bot.errors import DispatchError, NodeUnreachable

T = TypeVar("T")

GIB = 1 << 30
BLOCK = 256 * 1024  # bytes per SFTP read
IN_FLIGHT = 16  # reads of one file in flight at once
CLOSE_S = 5.0  # the longest a file's close waits for the node
FILES_AT_ONCE = 8  # files fetched at the same time (a round trip each would add up)
# Written by the bot, read back by it (where the run is, what it sent, which nodes run its
# Ray, its report): the node's copy never replaces them ("ray_cluster.json" is
# volume_cluster.CLUSTER_FILE, "report.html"/"report-summary.png" bot.service.report_files's,
# ".end.lock" bot.service.end_lock's: the lock the bot holds while it fetches).
BOT_FILES = frozenset({"spec.json", "manifest.yaml", "remote.json", "evidence-fetch.json",
                       "ray_cluster.json", "report.html", "report-summary.png",
                       ".end.lock"})


@dataclass(frozen=True)
class FetchLimits:
    """The most a fetch brings back: ``total_bytes`` in all (run directory and evidence
    copy together), ``file_bytes`` for one file (settings: ``PREFLIGHT_FETCH_MAX_BYTES``,
    ``PREFLIGHT_FETCH_MAX_FILE_BYTES``)."""

    total_bytes: int = 4 * GIB
    file_bytes: int = 2 * GIB


class SSHDispatcher(Protocol):
    """What a fetch needs of ``bot.dispatch.ssh.SSHDispatcher`` (no import back to it)."""

    attempts: int
    backoff: Backoff
    fetch_limits: FetchLimits

    async def guarded(self, node: SSHNode,
                      work: Callable[[Any], Coroutine[Any, Any, T]]) -> T: ...

    async def sftp_of(self, conn: Any) -> Any: ...

LOCAL_ERRORS = (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


async def fetch_results(dispatcher: SSHDispatcher, handle: RunHandle, node: SSHNode,
                        layout: dict[str, Any]) -> Path | None:
    """Copy the run directory (and the evidence copy) back; raise ``NodeUnreachable`` when
    every try was cut off, ``DispatchError`` when the node answered but the copy failed
    (or held something refused). Returns the verified evidence copy on the bot host, when
    there is one."""
    evidence = layout.get("evidence") or {}
    for attempt in range(dispatcher.attempts):
        try:
            await dispatcher.guarded(node, lambda conn: _copy(dispatcher, conn, handle, layout))
            break
        except NodeUnreachable as exc:
            if attempt + 1 == dispatcher.attempts:
                raise NodeUnreachable(f"cannot fetch the results of {handle.run_id} after "
                                      f"{dispatcher.attempts} tries: {exc}") from exc
            await asyncio.sleep(dispatcher.backoff.delay(attempt))
        finally:
            _remove(handle.run_dir / ".fetch")
            if evidence.get("local"):
                _remove(Path(evidence["local"]) / f".fetch-{handle.run_id}")
    if evidence.get("local"):
        copy = Path(evidence["local"]) / handle.run_id
        verify_fetched(handle, copy)
        return copy
    return None


async def _copy(dispatcher: SSHDispatcher, conn: Any, handle: RunHandle,
                layout: dict[str, Any]) -> None:
    sftp = await dispatcher.sftp_of(conn)
    run_dir = layout["run_dir"]
    evidence = layout.get("evidence") or {}
    budget = _Budget(handle.run_id, dispatcher.fetch_limits, current_meter())
    if budget.meter is not None:
        budget.meter.start()  # its bytes are learnt as the files are found
    try:
        staging = _fresh(handle.run_dir / ".fetch")
        names = [n for n in await sftp.listdir(run_dir)
                 if n not in (".", "..") and n not in BOT_FILES and not n.startswith(".fetch")]
        gate = asyncio.Semaphore(FILES_AT_ONCE)
        await _all(_get(sftp, f"{run_dir}/{name}", staging / name, name, budget, gate=gate)
                   for name in names)
        src = f"{evidence.get('remote')}/{handle.run_id}"
        copied = None
        if evidence.get("local") and await sftp.exists(src):
            dest = Path(evidence["local"])
            copied = _fresh(dest / f".fetch-{handle.run_id}")
            await _get(sftp, src, copied / handle.run_id, f"evidence copy {src}", budget,
                       gate=gate)
        # Complete: only now does anything replace what the bot host had.
        for name in names:
            _replace(staging / name, handle.run_dir / name)
        if copied is not None:
            _replace(copied / handle.run_id, Path(evidence["local"]) / handle.run_id)
    except LOCAL_ERRORS as exc:
        raise DispatchError(f"cannot write the results of {handle.run_id} on the bot "
                            f"host: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EEXIST, errno.ELOOP):
            raise DispatchError(f"cannot write the results of {handle.run_id} on the bot "
                                f"host: {exc}") from exc
        raise
    finally:
        if budget.meter is not None:
            budget.meter.end()  # a try cut off waits for the next: no transfer meanwhile


class _Budget:
    """The bytes a fetch has brought back so far, against its limits; told to the
    transfer's ``meter`` too (sizes found, bytes arrived, entries listed), if it has one."""

    def __init__(self, run_id: str, limits: FetchLimits, meter: Meter | None = None) -> None:
        self.run_id, self.limits, self.total = run_id, limits, 0
        self.meter = meter

    def check(self, rel: str, size: int) -> None:
        """Refuse, before a byte is read, a file the node says is over a cap."""
        if size > self.limits.file_bytes:
            raise self._over(rel, f"{size} bytes, over the cap of {self.limits.file_bytes} "
                                  "bytes per file")
        if self.total + size > self.limits.total_bytes:
            raise self._over(rel, f"it would bring the fetch to {self.total + size} bytes, "
                                  f"over the cap of {self.limits.total_bytes} bytes")
        if self.meter is not None:
            self.meter.expect(size)

    def add(self, rel: str, done: int, more: int) -> None:
        """``more`` bytes of ``rel`` arrived (``done`` before them): a file that grows past
        what the node said is stopped at the cap too."""
        if done + more > self.limits.file_bytes:
            raise self._over(rel, f"over {self.limits.file_bytes} bytes, the cap per file "
                                  "(it grew while it was fetched)")
        if self.total + more > self.limits.total_bytes:
            raise self._over(rel, f"the fetch passed {self.limits.total_bytes} bytes, its "
                                  "cap")
        self.total += more
        if self.meter is not None:
            self.meter.moved(more)

    def _over(self, rel: str, why: str) -> DispatchError:
        return DispatchError(
            f"run {self.run_id}: the results on the node are too large: {rel!r}: {why}; the "
            "fetch is refused and nothing was replaced (raise PREFLIGHT_FETCH_MAX_BYTES / "
            "PREFLIGHT_FETCH_MAX_FILE_BYTES on the bot host, or leave less in the run "
            "directory)")


async def _all(steps: Any) -> None:
    """Run ``steps`` (coroutines) at once; once all have ended, raise the first failure in
    their order (none is left running behind the caller)."""
    for result in await asyncio.gather(*steps, return_exceptions=True):
        if isinstance(result, BaseException):
            raise result


async def _get(sftp: Any, src: str, dst: Path, rel: str, budget: _Budget,
               attrs: Any = None, *, gate: asyncio.Semaphore) -> None:
    """Copy ``src`` (a folder or a regular file on the node) to the new path ``dst``; the
    files of a folder at once, ``gate`` allowing so many files in all."""
    if attrs is None or attrs.permissions is None:
        attrs = await sftp.lstat(src)  # never follows a link
    mode = attrs.permissions or 0
    if stat.S_ISDIR(mode):
        dst.mkdir(mode=0o755)  # new: the staging folder is the bot's own, made fresh
        entries = []
        async for entry in sftp.scandir(src):
            name = entry.filename
            if name in (".", ".."):
                continue
            if "/" in name or "\0" in name:
                raise _refused(budget.run_id, f"{rel}/{name}", "a name with a slash")
            entries.append((name, entry.attrs))
            if budget.meter is not None:
                budget.meter.moved()  # a listing moves no file's bytes, but it moves
        await _all(_get(sftp, f"{src}/{name}", dst / name, f"{rel}/{name}", budget, found,
                        gate=gate) for name, found in entries)
    elif stat.S_ISREG(mode):
        async with gate:
            await _get_file(sftp, src, dst, rel, budget, int(attrs.size or 0))
    else:
        raise _refused(budget.run_id, rel, await _what(sftp, src, mode))


async def _get_file(sftp: Any, src: str, dst: Path, rel: str, budget: _Budget,
                    size: int) -> None:
    budget.check(rel, size)
    fd = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    opening = sftp.open(src, "rb")
    try:
        fh = await opening.__aenter__()
        try:
            # lstat said a regular file; what was opened must be one too (not a link or a
            # FIFO swapped in meanwhile: SFTP's open follows links on the node)
            opened = await fh.stat()
            if not stat.S_ISREG(opened.permissions or 0):
                raise _refused(budget.run_id, rel, "replaced by something other than a "
                                                  "regular file while it was fetched")
            done, expected = 0, int(opened.size or 0)
            while True:
                # as many reads as the size asks (one for a small file), at most IN_FLIGHT:
                # a file that grew is read on until a short read
                ahead = min(IN_FLIGHT, max(1, (expected - done) // BLOCK + 1))
                blocks = await asyncio.gather(*(fh.read(BLOCK, done + i * BLOCK)
                                                for i in range(ahead)))
                for data in blocks:
                    budget.add(rel, done, len(data))
                    _write_all(fd, data)
                    done += len(data)
                    if len(data) < BLOCK:
                        return
        finally:
            await _close(opening)
    finally:
        os.close(fd)


async def _close(opening: Any) -> None:
    """Close a node's file, waiting ``CLOSE_S`` at most for its answer: a node that stopped
    answering (a fetch cancelled as stalled) would hold the fetch's clean-up forever."""
    try:
        await asyncio.wait_for(opening.__aexit__(None, None, None), CLOSE_S)
    except Exception:  # timed out or cut off: what was read is judged already
        pass


async def _what(sftp: Any, src: str, mode: int) -> str:
    if stat.S_ISLNK(mode):
        try:
            target = await sftp.readlink(src)
        except Exception:  # the refusal matters, not the link's text
            return "a symbolic link"
        return f"a symbolic link (to {str(target)[:200]!r})"
    for test, what in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return what
    return f"of an unknown type (mode {mode:o})"


def _refused(run_id: str, rel: str, what: str) -> DispatchError:
    return DispatchError(
        f"run {run_id}: the node's results hold {posixpath.normpath(rel)!r}, which is {what}: "
        "only regular files and folders are fetched, so the fetch is refused and nothing "
        "was replaced on the bot host. The run's code left it in its run directory (or in "
        "the evidence copy): write a copy of the file there instead of a link")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _fresh(path: Path) -> Path:
    _remove(path)
    path.mkdir(parents=True)
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists() or path.is_symlink():
        path.unlink()


def _replace(src: Path, dst: Path) -> None:
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(src, dst)
