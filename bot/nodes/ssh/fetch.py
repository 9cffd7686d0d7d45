"""Bringing a finished SSH run's results back: retried after a drop, never half-verified,
and never trusted.

The remote run directory is copied into ``<run dir>/.fetch/`` and the evidence copy into
``<copy_to>/.fetch-<run id>/``; only a complete copy is moved into place, so a drop in the
middle leaves what was there before, never a half copy under the final name. A drop is
retried (the dispatcher's ``attempts``, with its backoff); the evidence is verified only
once its copy is complete (``verify_fetched``).

What comes back is written by the team's code, and once that code has run on the node the
node's SSH and SFTP answers can be the team's too (docs/security.md, "What comes back from
a node"). So the copy is walked here, not by ``sftp.get(recurse=True)`` (which recreates
the node's symbolic links on the bot host): every name the node lists, at any depth, passes
``node_name`` (one plain path component), each entry is looked at with ``lstat`` on the
node (never followed) and only regular files and folders are copied; anything else (a
symbolic link, a FIFO, a device, a socket) refuses the whole fetch, naming the path and the
run. Every create, replace and remove on the bot host is made relative to the descriptor of
the folder it must stay in (``HostDir``: the staging folder, the run directory, the folder
of the evidence home), each file created new (``O_EXCL | O_NOFOLLOW``), its bytes counted
against ``FetchLimits`` (per file and in all) as they arrive: a fetch over either cap fails
and replaces nothing. The bot's own records of the run (``BOT_RECORDS``: its spec,
manifest, ``remote.json``…) are never replaced by the node's copy, and the evidence home
is never a run directory nor the runs folder (``refuse_evidence_home``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import posixpath
import stat
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bot.dispatch.base import RunHandle
from bot.dispatch.bot_records import STAGING_PREFIX as STAGING
from bot.dispatch.bot_records import fetched_name
from bot.dispatch.evidence_home import refuse_evidence_home
from bot.dispatch.host_tree import HostDir
from bot.dispatch.node_names import listed_names, node_name
from bot.dispatch.upload import Backoff, SSHNode, verify_fetched
from bot.errors import DispatchError, NodeUnreachable
from bot.nodes.ssh.transfer import Meter, current_meter

T = TypeVar("T")
log = logging.getLogger(__name__)

GIB = 1 << 30
BLOCK = 256 * 1024  # bytes per SFTP read
IN_FLIGHT = 16  # reads of one file in flight at once
CLOSE_S = 5.0  # the longest a file's close waits for the node
FILES_AT_ONCE = 8  # files fetched at the same time (a round trip each would add up)
@dataclass(frozen=True)
class FetchLimits:
    """The most a fetch brings back: ``total_bytes`` in all (run directory and evidence
    copy together), ``file_bytes`` for one file (settings: ``PREFLIGHT_FETCH_MAX_BYTES``,
    ``PREFLIGHT_FETCH_MAX_FILE_BYTES``)."""

    total_bytes: int = 4 * GIB
    file_bytes: int = 2 * GIB


class SSHDispatcher(Protocol):
    """What a fetch needs of ``bot.nodes.ssh.dispatcher.SSHDispatcher`` (no import back to it)."""

    attempts: int
    backoff: Backoff
    fetch_limits: FetchLimits
    keep_out: tuple[Path, ...]  # the bot's own folders no evidence home may touch

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
    home = Path(evidence["local"]) / handle.run_id if evidence.get("local") else None
    if home is not None:
        refuse_evidence_home(handle, home, dispatcher.keep_out)
    for attempt in range(dispatcher.attempts):
        try:
            await dispatcher.guarded(node, lambda conn: _copy(dispatcher, conn, handle,
                                                               node, layout))
            break
        except NodeUnreachable as exc:
            if attempt + 1 == dispatcher.attempts:
                raise NodeUnreachable(f"cannot fetch the results of {handle.run_id} after "
                                      f"{dispatcher.attempts} tries: {exc}") from exc
            await asyncio.sleep(dispatcher.backoff.delay(attempt))
    if home is not None:
        verify_fetched(handle, home)
        return home
    return None


async def _copy(dispatcher: SSHDispatcher, conn: Any, handle: RunHandle, node: SSHNode,
                layout: dict[str, Any]) -> None:
    """One try: everything staged first (``.fetch`` in the run directory, ``.fetch-<run
    id>`` beside the evidence home), each write relative to the bot host's folder it must
    stay in (``HostDir``); the staging folders are gone once it ends, whichever way."""
    sftp = await dispatcher.sftp_of(conn)
    run_dir = layout["run_dir"]
    evidence = layout.get("evidence") or {}
    budget = _Budget(handle.run_id, node.where, dispatcher.fetch_limits, current_meter())
    if budget.meter is not None:
        budget.meter.start()  # its bytes are learnt as the files are found
    held: list[HostDir] = []
    try:
        local = _hold(held, HostDir(handle.run_dir))
        staging = _hold(held, local.fresh(STAGING))
        names = [n for n in listed_names(await sftp.listdir(run_dir), node.where, run_dir)
                 if fetched_name(n)]
        gate = asyncio.Semaphore(FILES_AT_ONCE)
        await _all(_get(sftp, f"{run_dir}/{name}", staging, (name,), name, budget, gate=gate)
                   for name in names)
        src = f"{evidence.get('remote')}/{handle.run_id}"
        copied = dest = None
        if evidence.get("local") and await sftp.exists(src):
            dest = _hold(held, HostDir(Path(evidence["local"]), create=True))
            copied = _hold(held, dest.fresh(f"{STAGING}-{handle.run_id}"))
            await _get(sftp, src, copied, (handle.run_id,), f"evidence copy {src}", budget,
                       gate=gate)
        # Complete: only now does anything replace what the bot host had.
        for name in names:
            staging.replace_into(name, local, name)
        if copied is not None and dest is not None:
            copied.replace_into(handle.run_id, dest, handle.run_id)
    except LOCAL_ERRORS as exc:
        raise DispatchError(f"cannot write the results of {handle.run_id} on the bot "
                            f"host: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EEXIST, errno.ELOOP,
                         errno.EINVAL, errno.EMFILE):
            raise DispatchError(f"cannot write the results of {handle.run_id} on the bot "
                                f"host: {exc}") from exc
        raise
    finally:
        if budget.meter is not None:
            budget.meter.end()  # a try cut off waits for the next: no transfer meanwhile
        _release(held)


def _hold(held: list[HostDir], folder: HostDir) -> HostDir:
    held.append(folder)
    return folder


def _release(held: list[HostDir]) -> None:
    """The staging folders removed (each from the folder that holds it), every folder
    closed, the innermost first."""
    for parent, child in zip(held, held[1:]):
        if child.path.name.startswith(STAGING) and child.path.parent == parent.path:
            try:
                parent.remove(child.path.name)
            except OSError as exc:  # left for the next try, which removes it first
                log.warning("%s: staging folder not removed: %s", child.path, exc)
    for folder in reversed(held):
        folder.close()


class _Budget:
    """The bytes a fetch has brought back so far, against its limits; told to the
    transfer's ``meter`` too (sizes found, bytes arrived, entries listed), if it has one."""

    def __init__(self, run_id: str, where: str, limits: FetchLimits,
                 meter: Meter | None = None) -> None:
        self.run_id, self.where, self.limits, self.total = run_id, where, limits, 0
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


async def _get(sftp: Any, src: str, dst: HostDir, parts: tuple[str, ...], rel: str,
               budget: _Budget, attrs: Any = None, *, gate: asyncio.Semaphore) -> None:
    """Copy ``src`` (a folder or a regular file on the node) to the new path ``parts``
    below ``dst``; the files of a folder at once, ``gate`` allowing so many files in all.
    Every name the node lists passes ``node_name`` first."""
    if attrs is None or attrs.permissions is None:
        attrs = await sftp.lstat(src)  # never follows a link
    mode = attrs.permissions or 0
    if stat.S_ISDIR(mode):
        dst.mkdir(parts)  # new: the staging folder is the bot's own, made fresh
        entries = []
        async for entry in sftp.scandir(src):
            if entry.filename in (".", ".."):
                continue
            name = node_name(entry.filename, budget.where, src)
            entries.append((name, entry.attrs))
            if budget.meter is not None:
                budget.meter.moved()  # a listing moves no file's bytes, but it moves
        await _all(_get(sftp, f"{src}/{name}", dst, (*parts, name), f"{rel}/{name}", budget,
                        found, gate=gate) for name, found in entries)
    elif stat.S_ISREG(mode):
        async with gate:
            budget.check(rel, int(attrs.size or 0))
            fd = dst.create(parts)
            try:
                await _get_file(sftp, src, fd, rel, budget)
            finally:
                os.close(fd)
    else:
        raise _refused(budget.run_id, rel, await _what(sftp, src, mode))


async def _get_file(sftp: Any, src: str, fd: int, rel: str, budget: _Budget) -> None:
    """The bytes of the node's file ``src`` written to ``fd``, counted against the caps."""
    opening = sftp.open(src, "rb")
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
