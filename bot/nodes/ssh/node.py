"""SSHNodes: what the SSH dispatcher does on one node, over its sessions (``session.py``).

The node's side of the launcher's protocol (``bot/node_programs/launcher.py``): take the
workdir's lock and read the node's file hashes (``_lock``), send one archive stream
(``_stream``), remove stale files (``_remove``), launch the runner (``_launch``); where the
workdir is (``_workdir``); whether the runner lives, read from its /proc entry over SFTP
(``_probe_files``). ``SSHDispatcher`` (``dispatcher.py``) composes a start and a
volume's copies out of these, ``SSHAdapter`` (``adapter.py``) the follower's probe; the
tests reach them as seams.
"""

from __future__ import annotations

import asyncio
import json
import posixpath
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bot.dispatch.node_output import NODE_OUTPUT_CAP, read_capped, read_lines, too_large
from bot.dispatch.upload import SSHNode, UploadPlan
from bot.errors import DispatchError
from bot.node_programs.launcher import stat_fields
from bot.nodes.ssh.answers import HashAnswer, launched_pid, lock_holder
from bot.nodes.ssh.archive import Entry, write_archive
from bot.nodes.ssh.library import asyncssh
from bot.nodes.ssh.session import SSHSessions
from bot.nodes.ssh.transfer import current_meter


class SSHNodes(SSHSessions):
    """The launcher's protocol and the runner's probe on a node, over ``SSHSessions``."""

    async def _lock(self, node: SSHNode, plan: UploadPlan,
                    command: str | None = None) -> tuple[Any, dict[str, dict[str, str]]]:
        """Start the node's launcher: it holds the workdir's lock until told to launch; and
        the node's hashes of the files under the plan's roots, read by the launcher under
        that lock. One SSH session for both (each costs the node's login shell start-up),
        the connection's SFTP channel started meanwhile for the upload."""
        async def work(conn: Any) -> tuple[Any, str]:
            proc = await conn.create_process(
                command or plan.launch_command(node.python, plan.resume), encoding=None)
            # read by the launcher once it holds the lock
            proc.stdin.write(plan.hash_request().encode())
            reply = await _line(proc, "before the launcher answered")
            return proc, reply

        launcher, reply = await self.guarded(node, work)
        try:
            lock_holder(reply, node.where, plan.workdir, node.python, plan.run_id)
            hashes = await self.guarded(node, lambda _conn: _hashes(launcher, node, plan))
        except BaseException:
            await release_launcher(launcher)
            raise
        return launcher, hashes

    async def _launch(self, node: SSHNode, launcher: Any, env: dict[str, str]) -> int:
        async def work(conn: Any) -> str:
            launcher.stdin.write((f"launch {json.dumps(env)}\n" if env else "launch\n").encode())
            raw = await read_capped(launcher.stdout, NODE_OUTPUT_CAP)
            if raw is None:
                launcher.close()
                raise too_large(node.where, "the launcher", "output", NODE_OUTPUT_CAP)
            out = raw.decode("utf-8", errors="replace")
            if not out.strip():
                await _cut_off(launcher, "before the launcher printed the runner's pid")
            return out

        return launched_pid(await self.guarded(node, work), node.where)

    async def _workdir(self, node: SSHNode) -> str:
        workdir = node.workdir
        if workdir.startswith("/"):
            return workdir.rstrip("/") or "/"
        home = (await self._exec(node, "pwd")).strip()
        return posixpath.join(home, workdir[2:] if workdir.startswith("~/") else workdir)

    async def _stream(self, node: SSHNode, launcher: Any, send: list[tuple[Path, str]],
                      data: dict[str, bytes], workdir: str = "",
                      report: Callable[[int, int], None] | None = None) -> None:
        """Sends the files as one tar stream on the launcher's standard input (``tar``,
        ``bot/nodes/ssh/archive.py``): ``send`` (local path, remote path), then ``data``
        (remote path -> bytes), every remote path under ``workdir``; then ``sync``: an
        error names the files the node could not write or the member it refused.
        ``report(bytes done, bytes in all)`` hears of the progress (from the writer's
        thread); the task's transfer meter, if any, hears of every chunk the channel
        took (a stall is judged by it, ``watched``)."""
        entries: list[Entry] = [*send, *((raw, dst) for dst, raw in data.items())]
        base = workdir or _common_workdir([dst for _src, dst in entries])
        loop = asyncio.get_running_loop()
        meter = current_meter()
        stop = threading.Event()  # the stream was given up: the writer's thread ends too

        async def push(chunk: bytes) -> None:
            launcher.stdin.write(chunk)
            await launcher.stdin.drain()

        def send_chunk(chunk: bytes) -> None:
            sent = asyncio.run_coroutine_threadsafe(push(chunk), loop)
            while True:
                try:
                    sent.result(1.0)
                    break
                except TimeoutError:
                    if sent.done():
                        raise
                    if stop.is_set():
                        sent.cancel()
                        raise DispatchError(f"{node.where}: the upload was given up") from None
            if meter is not None:
                meter.moved(len(chunk))

        def progress(done: int, total: int) -> None:
            if meter is not None and done == 0 and not meter.active:
                meter.start(total)  # write_archive's first report: the bytes to move
            if report is not None:
                report(done, total)

        async def work(conn: Any) -> str:
            launcher.stdin.write(b"tar\n")
            try:
                await asyncio.to_thread(write_archive, entries, base, send_chunk, progress)
            finally:
                stop.set()
                if meter is not None:
                    meter.end()  # the node's answer that follows is no transfer
            launcher.stdin.write(b"sync\n")
            return await _line(launcher, "before the launcher confirmed the upload")

        reply = await self.guarded(node, work)
        try:
            failed = json.loads(reply)["failed"]
        except (ValueError, KeyError, TypeError):
            failed = [f"the launcher answered {reply.strip()[:200]!r}"]
        if not isinstance(failed, list):
            failed = [f"the launcher answered {reply.strip()[:200]!r}"]
        if failed:
            raise DispatchError(f"{node.where}: the upload failed: "
                                f"{'; '.join(str(f)[:300] for f in failed[:5])}")

    async def _remove(self, node: SSHNode, stale: list[str]) -> None:
        """Files the project no longer has, removed from the node's copy (over SFTP)."""
        async def work(conn: Any) -> None:
            sftp = await self.sftp_of(conn)
            for i in range(0, len(stale), 16):
                await asyncio.gather(*(sftp.remove(path) for path in stale[i:i + 16]))

        await self.guarded(node, work)

    async def _probe_files(self, node: SSHNode, pid: Any, run_dir: str) -> str | None:
        """``done`` (exit_code written), ``starting`` (no pid anywhere yet), ``alive`` (its
        /proc entry, not a zombie) or ``dead``; None when the node has no /proc."""
        async def work(conn: Any) -> str | None:
            sftp = await self.sftp_of(conn)
            if await sftp.exists(f"{run_dir}/exit_code"):
                return "done"
            known = pid if isinstance(pid, int) and pid > 1 else None
            if known is None:
                raw = (await _small_file(sftp, f"{run_dir}/runner.pid") or b"").strip()
                if not raw:
                    return "starting"
                if not raw.isdigit():
                    return "dead"
                known = int(raw)
            stat = await _small_file(sftp, f"/proc/{known}/stat")
            if stat is None:
                return "dead" if await sftp.exists("/proc/self/stat") else None
            return "dead" if stat_fields(stat)[:1] == ["Z"] else "alive"

        return await self.guarded(node, work)

async def _small_file(sftp: Any, path: str) -> bytes | None:
    """The first 4 KiB of a node's file (a pid file, a /proc entry); None if it is absent."""
    try:
        async with sftp.open(path, "rb") as fh:
            return bytes(await fh.read(4096))
    except asyncssh.SFTPNoSuchFile:
        return None


async def _line(proc: Any, when: str) -> str:
    """One line of a remote process's binary output ('' once it ended, told apart from a
    drop by ``_cut_off``)."""
    line = bytes(await proc.stdout.readline())
    if not line:
        await _cut_off(proc, when)
    return line.decode("utf-8", errors="replace")


def _common_workdir(paths: list[str]) -> str:
    """The folder every remote path lies under (a caller that names no workdir)."""
    return posixpath.commonpath([posixpath.dirname(p) for p in paths]) if paths else "/"


async def _hashes(launcher: Any, node: SSHNode, plan: UploadPlan) -> dict[str, dict[str, str]]:
    """The launcher's hash answer, line by line (each line capped, the files counted)."""
    answer = HashAnswer(node.where, node.python, plan.roots())
    try:
        after = await read_lines(launcher.stdout, answer.feed)
    except EOFError:
        await _cut_off(launcher, "before the launcher printed the file hashes")
        raise DispatchError(f"{node.where}: the launcher ended before the end of its file "
                            "hashes") from None
    if after is None:
        raise too_large(node.where, "the launcher", "output (one line of its file hashes)",
                        NODE_OUTPUT_CAP)
    if after.strip():
        raise DispatchError(f"{node.where}: the launcher printed {after[:200]!r} after its "
                            "file hashes: the node's answer is refused")
    return answer.hashes


async def _cut_off(proc: Any, when: str) -> None:
    """A remote process whose output ended early: a drop if it ended with no exit status."""
    try:
        await asyncio.wait_for(proc.wait(), 10)
    except asyncio.TimeoutError as exc:
        raise ConnectionResetError(f"no answer {when}") from exc
    if proc.exit_status is None:
        raise ConnectionResetError(f"the connection dropped {when}")


async def release_launcher(launcher: Any) -> None:
    """Close the launcher's stdin: unless it launched, it drops the lock and exits."""
    try:
        launcher.stdin.write_eof()
        await asyncio.wait_for(launcher.wait(), 10)
    except (OSError, asyncssh.Error, asyncio.TimeoutError):
        launcher.close()

