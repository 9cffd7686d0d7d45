"""Bringing a finished SSH run's results back: one stream per node, resumed after a cut,
never half-verified, and never trusted.

What comes back is the run's **evidence copy** only (``<evidence remote>/<run id>``:
shards, index, ``SHA256SUMS``, the balance, events, manifest): the node's run directory is
not copied a second time. The bot's events are mirrored as they are read
(``read_events``); the balance the thread uploads is linked from the fetched copy into
the run directory (``RUN_RECORDS``). A run without an evidence copy (no
``results.copy_to``) brings back its run directory instead, less the bot's own records
(``fetched_name``).

One try is one process on the node over the connection the dispatch already holds
(``bot/node_programs/fetch_stream.py``): it writes a tar stream of the folder to its
stdout, read here member by member as it arrives (``TarReader``). The staging folder
(``.fetch-<run id>`` beside the evidence home, ``.fetch`` in the run directory) is kept
after a cut try: the next try sends the node each held file's SHA-256, and the node
leaves out those its ``SHA256SUMS`` still gives (a marked empty member instead), so a cut
fetch goes on from what verifies. Only a complete try's copy, verified
(``verify_fetched``), replaces what the bot host had.

What comes back is written by the team's code, and once that code has run on the node the
node's SSH answers can be the team's too (docs/security.md, "What comes back from a
node"). So every member's name passes ``node_name`` per component; only regular files and
folders are written, anything else (a link, a FIFO, a device, a socket) refuses the fetch
naming the path; every file's SHA-256 is compared with its ``SHA256SUMS`` line as it
arrives (a shard that differs is refused by name); the files and bytes are counted against
``FetchLimits`` as they arrive (a member whose header asks more is stopped at its header,
named). Every write on the bot host is relative to the folder it must stay in
(``HostDir``). A refusal removes the staging folder and replaces nothing.
"""

from __future__ import annotations

import asyncio
import errno
import hashlib
import json
import logging
import os
import posixpath
import tarfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bot.dispatch.base import RunHandle
from bot.dispatch.bot_records import BOT_RECORDS, fetched_name
from bot.dispatch.bot_records import STAGING_PREFIX as STAGING
from bot.dispatch.evidence_home import refuse_evidence_home
from bot.dispatch.host_tree import HostDir
from bot.dispatch.node_names import NodeNameRefused, node_name
from bot.dispatch.upload import Backoff, SSHNode, verify_fetched
from bot.errors import DispatchError, NodeUnreachable
from bot.node_programs import fetch_command
from bot.node_programs.fetch_stream import MISSING, SOCKET
from bot.nodes.ssh.fetch_staging import (
    Budget,
    FetchLimits,
    held_files,
    link_records,
    prune,
    record_fetched,
)
from bot.nodes.ssh.tar_reader import Member, TarReader, TarStreamError
from bot.nodes.ssh.transfer import current_meter
from runner.evidence import SUMS, parse_sums

__all__ = ["FetchLimits", "fetch_results"]

T = TypeVar("T")
log = logging.getLogger(__name__)

SUMS_MAX = 64 << 20  # SHA256SUMS read whole: one line per shard and plain file
STDERR_MAX = 64 << 10
EXIT_WAIT_S = 10.0  # how long a stream that ended waits for the node's exit status


class FolderMissing(DispatchError):
    """The folder to fetch is not on the node."""


class SSHDispatcher(Protocol):
    """What a fetch needs of ``bot.nodes.ssh.dispatcher.SSHDispatcher`` (no import back to it)."""

    attempts: int
    backoff: Backoff
    fetch_limits: FetchLimits
    keep_out: tuple[Path, ...]  # the bot's own folders no evidence home may touch

    async def guarded(self, node: SSHNode,
                      work: Callable[[Any], Coroutine[Any, Any, T]]) -> T: ...


LOCAL_ERRORS = (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)
HOST_ERRNOS = (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EEXIST, errno.ELOOP,
               errno.EINVAL, errno.EMFILE)


@dataclass(frozen=True)
class FetchJob:
    """One fetch: the node's folder, where it lands on the bot host, and how it is named."""

    run_id: str
    src: str  # the folder on the node
    dest: Path  # the folder on the bot host that receives it
    name: str | None  # the name it gets in ``dest`` (None: its entries go into ``dest``)
    staging: str  # the staging folder's name in ``dest``
    skip: tuple[str, ...]  # top-level names the node leaves out
    evidence: bool  # an evidence copy: every file is checked against its SHA256SUMS
    inputs: int = 0  # the run's expected inputs: its caps are sized for them (0: unknown)
    max_bytes: int = 0  # the run's own bytes cap, sized by the bot in its spec (0: none)

    def shown(self, rel: str) -> str:
        return f"evidence copy {self.src}/{rel}" if self.evidence else rel


def job_of(handle: RunHandle, layout: dict[str, Any]) -> FetchJob:
    evidence = layout.get("evidence") or {}
    inputs, max_bytes = _sized_for(handle)
    max_bytes = 0 if handle.ceiling else max_bytes
    if evidence.get("local") and evidence.get("remote"):
        return FetchJob(handle.run_id, f"{evidence['remote']}/{handle.run_id}",
                        Path(evidence["local"]), handle.run_id,
                        f"{STAGING}-{handle.run_id}", (), True, inputs, max_bytes)
    return FetchJob(handle.run_id, layout["run_dir"], handle.run_dir, None, STAGING,
                    tuple(sorted(BOT_RECORDS)), False, inputs, max_bytes)


def _sized_for(handle: RunHandle) -> tuple[int, int]:
    """The run's expected inputs and its own bytes cap, from the spec the bot wrote (0
    where it cannot tell)."""
    try:
        spec = json.loads(handle.spec_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return 0, 0
    return (_count(spec, "inputs", "expected_count"),
            _count(spec, "results", "fetch_max_bytes"))


def _count(spec: Any, section: str, key: str) -> int:
    value = spec.get(section, {}).get(key) \
        if isinstance(spec, dict) and isinstance(spec.get(section), dict) else None
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


async def fetch_results(dispatcher: SSHDispatcher, handle: RunHandle, node: SSHNode,
                        layout: dict[str, Any]) -> Path | None:
    """Bring the evidence copy back (the run directory when the node has none: the run
    died before its evidence stage, or refused it); raise ``NodeUnreachable`` when every
    try was cut off (what verified is kept for the next fetch), ``DispatchError`` when the
    node answered but the copy was refused. Returns the verified evidence copy on the bot
    host, when there is one."""
    job = job_of(handle, layout)
    home = job.dest / job.name if job.name else None
    if home is not None:
        refuse_evidence_home(handle, home, dispatcher.keep_out)
    try:
        measured = await _fetch(dispatcher, job, node)
    except FolderMissing:
        if not job.evidence:
            raise
        measured = await _fetch(dispatcher, job_of(handle, {**layout, "evidence": {}}), node)
    record_fetched(handle.run_dir, measured)
    if home is None:
        return None
    verify_fetched(handle, home)
    link_records(handle.run_id, home, handle.run_dir)
    return home


async def _fetch(dispatcher: SSHDispatcher, job: FetchJob, node: SSHNode
                 ) -> tuple[float, int, int]:
    """``dispatcher.attempts`` tries, with its backoff between them; the complete try's
    (seconds, files, bytes) its stream carried."""
    for attempt in range(dispatcher.attempts):
        try:
            return await dispatcher.guarded(node,
                                            lambda conn: _try(dispatcher, conn, job, node))
        except NodeUnreachable as exc:
            if attempt + 1 == dispatcher.attempts:
                raise NodeUnreachable(f"cannot fetch the results of {job.run_id} after "
                                      f"{dispatcher.attempts} tries (what arrived is kept "
                                      f"for the next fetch): {exc}") from exc
            await asyncio.sleep(dispatcher.backoff.delay(attempt))
    raise AssertionError("unreachable: the last try returns or raises")


async def _try(dispatcher: SSHDispatcher, conn: Any, job: FetchJob, node: SSHNode
               ) -> tuple[float, int, int]:
    """One try: the stream read into the kept staging folder; complete, it replaces what
    the bot host had, and returns the seconds, files and bytes its stream carried (the
    files a cut try left held aside). A cut keeps the staging folder; a refusal removes it."""
    began = time.monotonic()
    budget = Budget(job.run_id,
                    dispatcher.fetch_limits.for_inputs(job.inputs).under(job.max_bytes),
                    current_meter())
    if budget.meter is not None:
        budget.meter.start()  # its bytes are learnt as the members arrive
    dest = staging = None
    try:
        dest = HostDir(job.dest, create=job.evidence)
        staging = dest.kept(job.staging)
        await _stream(conn, job, node, staging, budget)
        # Complete: only now does anything replace what the bot host had.
        if job.name is not None:
            staging.replace_into(job.name, dest, job.name)
        else:
            for name in sorted(os.listdir(staging.path)):
                staging.replace_into(name, dest, name)
        dest.remove(job.staging)
        return time.monotonic() - began, budget.sent_files, budget.sent_bytes
    except DispatchError:
        _drop_staging(dest, job.staging)
        raise
    except LOCAL_ERRORS as exc:
        _drop_staging(dest, job.staging)
        raise _host_error(job, exc) from exc
    except OSError as exc:
        if exc.errno in HOST_ERRNOS:
            _drop_staging(dest, job.staging)
            raise _host_error(job, exc) from exc
        raise  # the connection: NodeUnreachable, the staging folder kept
    finally:
        if budget.meter is not None:
            budget.meter.end()  # a try cut off waits for the next: no transfer meanwhile
        for folder in (staging, dest):
            if folder is not None:
                folder.close()


async def _stream(conn: Any, job: FetchJob, node: SSHNode, staging: HostDir,
                  budget: Budget) -> None:
    """Ask the node for the folder, telling it what the staging folder holds; read its
    stream to the end, then check how the node's program ended."""
    prefix = f"{job.name}/" if job.name else ""
    held = {rel[len(prefix):]: (digest, size) for rel, digest, size in held_files(staging)
            if rel.startswith(prefix)}
    if job.name is not None:
        staging.ensure_dir((job.name,))
    proc = await conn.create_process(fetch_command(node.python, job.src, *job.skip),
                                     encoding=None)
    errors = asyncio.ensure_future(proc.stderr.read(STDERR_MAX))
    try:
        proc.stdin.write("".join(f"{d}  {rel}\n" for rel, (d, _) in held.items()).encode(
            "utf-8", "surrogateescape"))
        proc.stdin.write_eof()
        reader = _Reader(job, node, staging, budget, held)
        try:
            await reader.read_all(TarReader(proc.stdout.read))
        except TarStreamError as exc:
            await _ended(proc, errors, job, node, f"its stream broke: {exc}")
            raise DispatchError(f"run {job.run_id}: {node.where} sent a stream of "
                                f"{job.src} that is not a tar stream: {exc}") from exc
        await _ended(proc, errors, job, node, "")
    finally:
        errors.cancel()
        proc.close()
    prune(staging, {prefix + rel for rel in reader.named})


async def _ended(proc: Any, errors: asyncio.Future[bytes], job: FetchJob, node: SSHNode,
                 why: str) -> None:
    """A cut connection (no exit status) is ``ConnectionResetError`` (tried again); a
    program that failed is ``DispatchError`` with its words."""
    try:
        await asyncio.wait_for(proc.wait(), EXIT_WAIT_S)
    except asyncio.TimeoutError:
        pass
    status = proc.exit_status
    if status is None:
        raise ConnectionResetError(f"the fetch's stream was cut ({why or 'no exit status'})")
    said = errors.result() if errors.done() and not errors.cancelled() else b""
    if status == MISSING:
        raise FolderMissing(f"run {job.run_id}: {node.where}: {job.src} is missing on the "
                            "node (it was removed, or the run never wrote it)")
    if status != 0:
        raise DispatchError(f"run {job.run_id}: {node.where} could not send {job.src} "
                            f"(exit {status}): "
                            f"{said.decode('utf-8', 'replace').strip()[-600:]}")


class _Reader:
    """The stream's members written into the staging folder, each checked."""

    def __init__(self, job: FetchJob, node: SSHNode, staging: HostDir, budget: Budget,
                 held: dict[str, tuple[str, int]]) -> None:
        self.job, self.node, self.staging, self.budget, self.held = \
            job, node, staging, budget, held
        self.sums: dict[str, str] | None = None
        self.named: set[str] = set()

    async def read_all(self, tar: TarReader) -> None:
        while (member := await tar.next()) is not None:
            parts = self._parts(member.name)
            rel = "/".join(parts)
            if not self.job.evidence and not fetched_name(parts[0]):
                async for _ in tar.chunks(member):  # the bot's own record: never replaced
                    pass
                continue
            if member.is_dir:
                self.staging.ensure_dir(self._where(parts))
                if self.budget.meter is not None:
                    self.budget.meter.moved()
            elif member.is_file and member.held is not None:
                self._kept(rel, member.held)
            elif member.is_file:
                await self._write(tar, member, parts, rel)
            else:
                raise self._refused(rel, _what(member))
            self.named.add(rel)

    def _parts(self, name: str) -> tuple[str, ...]:
        parts = name.rstrip("/").split("/") if name else [name]
        try:
            return tuple(node_name(p, self.node.where, self.job.src) for p in parts)
        except NodeNameRefused:  # refused again naming the whole member
            node_name(name, self.node.where, self.job.src)
            raise

    def _where(self, parts: tuple[str, ...]) -> tuple[str, ...]:
        return (self.job.name, *parts) if self.job.name else parts

    def _kept(self, rel: str, digest: str) -> None:
        """The node says the bot holds ``rel`` as it is: checked, counted, kept."""
        mine = self.held.get(rel)
        listed = self.sums.get(rel) if self.sums is not None else digest
        if mine is None or mine[0] != digest or listed != digest:
            raise DispatchError(
                f"run {self.job.run_id}: {self.node.where} says the bot holds "
                f"{self.job.shown(rel)!r} as it is, but the bot's copy does not match"
                f"{'' if listed == digest else ' its ' + SUMS + ' line'}: the fetch is "
                "refused and nothing was replaced")
        self.budget.file(rel, mine[1], held=True)
        if self.budget.meter is not None:
            self.budget.meter.moved()

    async def _write(self, tar: TarReader, member: Member, parts: tuple[str, ...],
                     rel: str) -> None:
        self.budget.file(rel, member.size)  # refused at its header when over a cap
        digest, done = hashlib.sha256(), 0
        fd = self.staging.create(self._where(parts), replace=True)
        try:
            async for piece in tar.chunks(member):
                self.budget.add(rel, done, len(piece), member.size)
                _write_all(fd, piece)
                digest.update(piece)
                done += len(piece)
        finally:
            os.close(fd)
        self.held.pop(rel, None)
        got = digest.hexdigest()
        listed = self.sums.get(rel) if self.sums is not None else None
        if listed is not None and listed != got:
            raise DispatchError(
                f"run {self.job.run_id}: the evidence copy's {rel!r} from {self.node.where} "
                f"has SHA-256 {got}, not {listed} as its line in {SUMS} says: the shard is "
                "refused, the fetch stopped and nothing was replaced on the bot host (the "
                "node's copy changed after it was written: `preflight verify` on the node "
                "names what else differs)")
        if self.job.evidence and parts == (SUMS,):
            self.sums = self._read_sums(parts)

    def _read_sums(self, parts: tuple[str, ...]) -> dict[str, str]:
        path = self.staging.path.joinpath(*self._where(parts))
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        with os.fdopen(fd, "rb") as fh:
            listed, _bad = parse_sums(fh.read(SUMS_MAX))
        return listed

    def _refused(self, rel: str, what: str) -> DispatchError:
        return DispatchError(
            f"run {self.job.run_id}: the node's results hold "
            f"{posixpath.normpath(self.job.shown(rel))!r}, which is {what}: only regular "
            "files and folders are fetched, so the fetch is refused and nothing was "
            "replaced on the bot host. The run's code left it in its run directory (or in "
            "the evidence copy): write a copy of the file there instead of a link")


def _what(member: Member) -> str:
    if member.type in (tarfile.SYMTYPE, tarfile.LNKTYPE):
        return f"a symbolic link (to {member.linkname[:200]!r})" \
            if member.type == tarfile.SYMTYPE else f"a hard link (to {member.linkname[:200]!r})"
    return {tarfile.FIFOTYPE: "a FIFO", SOCKET: "a socket", tarfile.CHRTYPE:
            "a character device", tarfile.BLKTYPE: "a block device"}.get(
        member.type, f"of an unknown type ({member.type!r})")


def _drop_staging(dest: HostDir | None, name: str) -> None:
    if dest is None:
        return
    try:
        dest.remove(name)
    except OSError as exc:  # left for the next try, which checks what it holds
        log.warning("%s/%s: staging folder not removed: %s", dest.path, name, exc)


def _host_error(job: FetchJob, exc: OSError) -> DispatchError:
    return DispatchError(f"cannot write the results of {job.run_id} on the bot host: {exc}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
