"""SSH sessions to the nodes (asyncssh): connections with host-key checks, a private event
loop thread, and ``guarded``, the one place that tells "the node answered" from "we could
not reach it". ``SSHDispatcher`` (``dispatcher.py``) and ``SSHAdapter`` (``adapter.py``,
the follower's reads and looks) are built on top of it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

from bot.dispatch.node_output import NODE_OUTPUT_CAP, run_capped
from bot.dispatch.upload import Backoff, ConnKey, SSHNode, conn_key, host_key_refused
from bot.errors import DispatchError, NodeUnreachable
from bot.nodes.ssh.library import asyncssh
from bot.nodes.ssh.transfer import Meter, TransferWatch, use_meter

T = TypeVar("T")
READ_LIMIT = 4 << 20
WATCH_EVERY_S = 1.0  # how often a watched transfer's progress is judged


class _PinnedClient(asyncssh.SSHClient):
    """Accepts exactly the host key whose SHA-256 fingerprint is pinned."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        return bool(key.get_fingerprint("sha256") == self.fingerprint)


class SSHSessions:
    """One connection (and SFTP client) per node, reused; every call through ``guarded``."""

    def __init__(self, *, known_hosts: Path | str | None = None,
                 client_keys: Sequence[Path | str] | None = None,
                 ssh_config: Path | str | None = None, use_agent: bool = True,
                 connect_timeout: float = 15.0,
                 backoff: tuple[float, float] = (0.25, 30.0)) -> None:
        self.known_hosts = str(known_hosts) if known_hosts else None
        self.client_keys = [str(k) for k in client_keys] if client_keys else None
        self.ssh_config = str(ssh_config) if ssh_config else None
        self.use_agent = use_agent
        self.connect_timeout = connect_timeout
        self.backoff = Backoff(*backoff)
        self._conns: dict[ConnKey, Any] = {}
        self._sftp: dict[int, Any] = {}  # id(connection) -> its SFTP client
        self._sftp_locks: dict[int, asyncio.Lock] = {}  # id(connection) -> its start's lock
        self.connects = 0
        self._locks: dict[ConnKey, asyncio.Lock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    def run(self, node: SSHNode, command: str, stdin: str = "",
            timeout: float = 120, cap: int = NODE_OUTPUT_CAP) -> tuple[int, str, str]:
        """Run one command on the node (``stdin`` fed to it, e.g. a secret that must not
        appear on a command line); returns (exit status, stdout, stderr), each stream read
        up to ``cap`` bytes (``NodeOutputTooLarge`` past it, naming the node)."""
        async def work(conn: Any) -> tuple[int, str, str]:
            code, out, err = await run_capped(conn, command, where=node.where, stdin=stdin,
                                              cap=cap)
            if code is None:
                raise ConnectionResetError("the command ended with no exit status")
            return code, out, err

        return self._call(self.guarded(node, work), timeout)

    def _may_try(self, node: SSHNode) -> None:
        wait = self.backoff.wait_s(conn_key(node))
        if wait > 0:
            raise NodeUnreachable(f"{node.where}: unreachable at the last try; next try "
                                  f"in {wait:.1f} s")

    def close(self) -> None:
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(30)
        # what another thread still waits on (a run's end fetching its results) ends now,
        # cancelled: its caller hears NodeUnreachable instead of waiting on a stopped loop
        asyncio.run_coroutine_threadsafe(_cancel_others(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        self._locks.clear()  # asyncio locks belong to the closed loop; a later call starts anew
        self.backoff.clear()

    # -- the event loop thread -------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T], timeout: float | None) -> T:
        """Run ``coro`` on the loop thread and wait for it: ``timeout`` seconds at most
        (None: it is bounded by itself, as ``watched`` is)."""
        with self._guard:
            if self._loop is None:
                self._loop = asyncio.new_event_loop()
                self._thread = threading.Thread(target=self._loop.run_forever,
                                                name="ssh-dispatch", daemon=True)
                self._thread.start()
            loop = self._loop
        future = asyncio.run_coroutine_threadsafe(coro, loop)
        try:
            return future.result(timeout)
        except concurrent.futures.CancelledError as exc:
            raise NodeUnreachable("the bot's SSH sessions were closed (the bot is stopping) "
                                  "before the node answered") from exc
        except TimeoutError as exc:
            if future.done():  # the coroutine's own timeout, not ours
                raise
            future.cancel()
            raise NodeUnreachable(f"an SSH operation took more than {timeout:.0f} s: the node "
                                  "does not answer") from exc

    async def watched(self, coro: Coroutine[Any, Any, T], watch: TransferWatch,
                      meter: Meter | None = None, nodes: Sequence[SSHNode] = ()) -> T:
        """``coro``, judged by ``watch`` (``bot/nodes/ssh/transfer.py``) instead of a wall
        limit: once the watch says a transfer stalled or the copy passed its ceiling, it is
        cancelled, its clean-up awaited, and ``NodeUnreachable`` raised with the watch's
        words (the node, the phase, the bytes moved). ``meter``: the current task's. The
        connection of a node (of ``nodes``) whose transfer stalled is dropped: its requests
        fail at once, and the next try connects afresh (a stuck SFTP server or channel is
        not reused)."""
        use_meter(meter)
        task = asyncio.ensure_future(coro)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=WATCH_EVERY_S)
                if done:
                    return task.result()
                verdict = watch.verdict()
                if verdict is not None:
                    break
        except BaseException:  # cancelled from outside: the work goes with it
            task.cancel()
            raise
        task.cancel()
        stalled = watch.stalled
        for node in nodes:
            if stalled is not None and node.where == stalled.where:
                self._drop(node)
        await asyncio.wait({task}, timeout=60)  # its clean-up done (launchers released)
        raise NodeUnreachable(verdict)

    async def _close_all(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for sftp in self._sftp.values():
            sftp.exit()
        self._sftp, self._sftp_locks = {}, {}
        for conn in conns:
            conn.close()
            await conn.wait_closed()

    # -- connections -------------------------------------------------------------------
    async def _conn(self, node: SSHNode) -> Any:
        key = conn_key(node)
        lock = self._locks.setdefault(key, asyncio.Lock())
        async with lock:
            conn = self._conns.get(key)
            if conn is not None and not conn.is_closed():
                return conn
            self._conns.pop(key, None)
            conn = await self._connect(node)
            self.connects += 1
            self._conns[key] = conn
            self.backoff.succeeded(key)
            return conn

    async def _connect(self, node: SSHNode) -> Any:
        options: dict[str, Any] = {"port": node.port, "connect_timeout": self.connect_timeout,
                                   "config": [self.ssh_config] if self.ssh_config else ()}
        if node.user:
            options["username"] = node.user
        if self.client_keys is not None:
            options["client_keys"] = self.client_keys
        if not self.use_agent:
            options["agent_path"] = None
        if node.host_key_fingerprint:
            fingerprint = node.host_key_fingerprint
            options["known_hosts"] = ([], [], [])
            options["client_factory"] = lambda: _PinnedClient(fingerprint)
        elif self.known_hosts is not None:
            options["known_hosts"] = self.known_hosts
        try:
            return await asyncssh.connect(node.host, **options)
        except asyncssh.HostKeyNotVerifiable as exc:
            raise host_key_refused(node, self.known_hosts, exc.reason) from exc
        except asyncssh.PermissionDenied as exc:
            raise DispatchError(
                f"{node.where}: SSH login refused for user {node.user or '(default)'}: the bot "
                "host's agent, key files and ~/.ssh/config offered no accepted key") from exc
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            raise NodeUnreachable(f"{node.where}: cannot connect: {exc}") from exc

    async def sftp_of(self, conn: Any) -> Any:
        """The connection's SFTP client, started once (callers at the same time share it)."""
        sftp = self._sftp.get(id(conn))
        if sftp is None:
            async with self._sftp_locks.setdefault(id(conn), asyncio.Lock()):
                sftp = self._sftp.get(id(conn))
                if sftp is None:
                    sftp = await conn.start_sftp_client()
                    self._sftp[id(conn)] = sftp
        return sftp

    def _drop(self, node: SSHNode) -> None:
        stale = self._conns.pop(conn_key(node), None)
        if stale is not None:
            sftp = self._sftp.pop(id(stale), None)
            self._sftp_locks.pop(id(stale), None)
            if sftp is not None:
                sftp.exit()
            stale.close()

    async def guarded(self, node: SSHNode, work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """Run ``work(conn)``: every remote call goes through here. "The node answered"
        (an exit status, a file, an SFTP error about a path) is returned or raised as
        ``DispatchError``; "we could not reach it" (connect refused or timed out, the
        connection lost, a command cut off with no exit status: ``work`` raises
        ``ConnectionResetError``) drops the connection and raises ``NodeUnreachable``."""
        try:
            conn = await self._conn(node)
            return await work(conn)
        except asyncssh.SFTPNoSuchFile as exc:  # the connection is fine; the path is not
            raise DispatchError(f"{node.where}: {exc.reason or 'no such file'}: a file or "
                                "directory of the run is missing on the node") from exc
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            self._drop(node)
            self.backoff.failed(conn_key(node))
            raise NodeUnreachable(f"{node.where}: {type(exc).__name__}: {exc}") from exc
        except NodeUnreachable:
            self.backoff.failed(conn_key(node))
            raise

    async def _exec(self, node: SSHNode, command: str, *, check: bool = True,
                    cap: int = NODE_OUTPUT_CAP) -> str:
        async def work(conn: Any) -> tuple[int, str, str]:
            code, out, err = await run_capped(conn, command, where=node.where, cap=cap)
            if code is None:
                raise ConnectionResetError("the command ended with no exit status: its "
                                           "connection dropped")
            return code, out, err

        code, out, err = await self.guarded(node, work)
        if check and code != 0:
            raise DispatchError(f"{node.where}: `{command[:80]}` failed "
                                f"(exit {code}): {err.strip()[-600:]}")
        return out

    async def _read(self, node: SSHNode, path: str, offset: int,
                    size: int = READ_LIMIT) -> bytes | None:
        """``size`` bytes of a node's file from ``offset`` (-1: to its end), over SFTP;
        None when there is no such file (``guarded`` takes an OSError for a lost node)."""
        async def work(conn: Any) -> bytes | None:
            sftp = await self.sftp_of(conn)
            try:
                async with sftp.open(path, "rb") as fh:
                    await fh.seek(offset)
                    return bytes(await fh.read(size))
            except asyncssh.SFTPNoSuchFile:
                return None

        return await self.guarded(node, work)

    async def _read_tail(self, node: SSHNode, path: str, limit: int) -> bytes:
        async def work(conn: Any) -> bytes:
            sftp = await self.sftp_of(conn)
            try:
                size = (await sftp.stat(path)).size or 0
                async with sftp.open(path, "rb") as fh:
                    await fh.seek(max(0, size - limit))
                    return bytes(await fh.read(limit))
            except asyncssh.SFTPNoSuchFile:
                return b""

        return await self.guarded(node, work)


async def _cancel_others() -> None:
    """Cancel every task of the running loop but this one, and let each unwind."""
    me = asyncio.current_task()
    others = [t for t in asyncio.all_tasks() if t is not me]
    for task in others:
        task.cancel()
    if others:
        await asyncio.wait(others, timeout=20)
