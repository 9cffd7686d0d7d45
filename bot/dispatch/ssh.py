"""SSHDispatcher: the runner on a rented node, reached over SSH (asyncssh).

- Credentials come only from the bot host (agent, key files, ``~/.ssh/config``); every
  path is injectable. Host keys are checked against known_hosts, or only against a pinned
  ``node.host_key_fingerprint``; an unknown or changed key refuses the run, never learned.
- ``start`` first takes the node workdir's lock (one runner per workdir: a dispatch never
  writes under a live runner, across bot processes too; a stale lock is taken over), then
  uploads the ``runner`` package, the project files whose SHA-256 differs from the node's
  copy (stale ones removed) and the run's ``spec.json`` / ``manifest.yaml``, writes the
  local ``remote.json``, and only then starts the runner detached (own session, output to
  ``runner.log``, exit status to ``exit_code``) and adds its pid to ``remote.json``. A
  bot that dies at any point still finds the run; without a pid it is "starting", not dead.
- ``read_events`` reads the remote ``events.jsonl`` from a byte offset and mirrors the
  complete lines locally. After a drop it reconnects with exponential backoff; while
  unreachable it returns nothing (and ``is_alive`` says yes: unknown is not dead).
- ``fetch_results`` mirrors the remote run directory back and, when ``results.copy_to`` is
  a path on the bot host, brings the evidence copy back there and verifies it.

The service calls these methods synchronously; the SSH work runs on a private event loop
thread. Call ``close`` when done. What is sent and run on the node, and the local files,
are ``bot/dispatch_ssh_plan.py``'s.
"""

from __future__ import annotations

import asyncio
import posixpath
import threading
from collections.abc import Callable, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import asyncssh

from bot.dispatch.base import RunHandle
from bot.dispatch.node_scripts import probe_command, stop_command
from bot.dispatch.upload import (
    RUNNER_PACKAGE,
    Backoff,
    ConnKey,
    SSHNode,
    UploadPlan,
    conn_key,
    host_key_refused,
    launched_pid,
    load_spec,
    locate,
    lock_holder,
    mirror,
    node_section,
    parse_hashes,
    verify_fetched,
    write_layout,
)
from bot.errors import DispatchError
from runner.events import Event, parse_chunk

T = TypeVar("T")
READ_LIMIT = 4 << 20


class _PinnedClient(asyncssh.SSHClient):
    """Accepts exactly the host key whose SHA-256 fingerprint is pinned."""

    def __init__(self, fingerprint: str) -> None:
        self.fingerprint = fingerprint

    def validate_host_public_key(self, host: str, addr: str, port: int,
                                 key: asyncssh.SSHKey) -> bool:
        return bool(key.get_fingerprint("sha256") == self.fingerprint)


class SSHDispatcher:
    def __init__(self, *, known_hosts: Path | str | None = None,
                 client_keys: Sequence[Path | str] | None = None,
                 ssh_config: Path | str | None = None, use_agent: bool = True,
                 runner_package: Path | None = None, connect_timeout: float = 15.0,
                 backoff: tuple[float, float] = (0.25, 30.0),
                 node_of: Callable[[RunHandle], dict[str, Any]] | None = None) -> None:
        self.known_hosts = str(known_hosts) if known_hosts else None
        self.client_keys = [str(k) for k in client_keys] if client_keys else None
        self.ssh_config = str(ssh_config) if ssh_config else None
        self.use_agent = use_agent
        self.runner_package = Path(runner_package or RUNNER_PACKAGE)
        self.connect_timeout = connect_timeout
        self.backoff = Backoff(*backoff)
        self.node_of = node_of or node_section
        self.uploaded: dict[str, dict[str, int]] = {}  # run id -> bytes by kind
        self.uploaded_files: dict[str, list[str]] = {}  # run id -> remote paths written
        self._conns: dict[ConnKey, Any] = {}
        self._sftp: dict[int, Any] = {}  # id(connection) -> its SFTP client
        self.connects = 0
        self._locks: dict[ConnKey, asyncio.Lock] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._guard = threading.Lock()

    # -- the Dispatcher protocol -----------------------------------------------------
    def start(self, handle: RunHandle) -> int | None:
        return self._call(self._start(handle), timeout=600)

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        node, layout = locate(handle)
        if not self.backoff.may_try(conn_key(node)):
            return [], offset
        try:
            chunk = self._call(self._read(node, layout["run_dir"] + "/events.jsonl", offset), 60)
        except _Unreachable:
            return [], offset
        events, new_offset = parse_chunk(chunk, offset)
        if new_offset > offset:
            mirror(handle.run_dir / "events.jsonl", offset, chunk[: new_offset - offset])
        return events, new_offset

    def is_alive(self, handle: RunHandle) -> bool:
        state = self._probe(handle)
        return state != "dead" and state != "done"

    def exit_code(self, handle: RunHandle) -> int | None:
        node, layout = locate(handle)
        try:
            raw = self._call(self._read(node, layout["run_dir"] + "/exit_code", 0), 60)
        except _Unreachable:
            return None
        return int(raw) if raw.strip().isdigit() else None

    def fetch_results(self, handle: RunHandle) -> None:
        self._call(self._fetch(handle, *locate(handle)), timeout=600)

    def stop(self, handle: RunHandle) -> None:
        node, layout = locate(handle)
        self._call(self._exec(node, stop_command(layout.get("pid"), layout["run_dir"])), 60)

    def close(self) -> None:
        with self._guard:
            loop, thread = self._loop, self._thread
            self._loop = self._thread = None
        if loop is None or thread is None:
            return
        asyncio.run_coroutine_threadsafe(self._close_all(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(30)
        loop.close()
        self._locks.clear()  # asyncio locks belong to the closed loop; a later call starts anew
        self.backoff.clear()

    # -- the event loop thread -------------------------------------------------------
    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
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
        except TimeoutError as exc:
            future.cancel()
            raise DispatchError(f"SSH operation took more than {timeout:.0f} s") from exc

    async def _close_all(self) -> None:
        conns, self._conns = list(self._conns.values()), {}
        for sftp in self._sftp.values():
            sftp.exit()
        self._sftp = {}
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
            raise _Unreachable(f"{node.where}: cannot connect: {exc}") from exc

    async def _sftp_of(self, conn: Any) -> Any:
        sftp = self._sftp.get(id(conn))
        if sftp is None:
            sftp = await conn.start_sftp_client()
            self._sftp[id(conn)] = sftp
        return sftp

    def _drop(self, node: SSHNode) -> None:
        stale = self._conns.pop(conn_key(node), None)
        if stale is not None:
            sftp = self._sftp.pop(id(stale), None)
            if sftp is not None:
                sftp.exit()
            stale.close()

    async def _guarded(self, node: SSHNode, work: Callable[[Any], Coroutine[Any, Any, T]]) -> T:
        """Run ``work(conn)``; a lost connection is dropped and reported as unreachable."""
        try:
            conn = await self._conn(node)
            return await work(conn)
        except asyncssh.SFTPNoSuchFile as exc:  # the connection is fine; the path is not
            raise DispatchError(f"{node.where}: {exc.reason or 'no such file'}: a file or "
                                "directory of the run is missing on the node") from exc
        except (OSError, asyncssh.Error, asyncio.TimeoutError) as exc:
            self._drop(node)
            self.backoff.failed(conn_key(node))
            raise _Unreachable(f"{node.where}: {type(exc).__name__}: {exc}") from exc
        except _Unreachable:
            self.backoff.failed(conn_key(node))
            raise

    async def _exec(self, node: SSHNode, command: str, *, check: bool = True) -> str:
        async def work(conn: Any) -> Any:
            return await conn.run(command, check=False)

        result = await self._guarded(node, work)
        if check and result.exit_status != 0:
            err = str(result.stderr or "").strip()[-600:]
            raise DispatchError(f"{node.where}: `{command[:80]}` failed "
                                f"(exit {result.exit_status}): {err}")
        return str(result.stdout or "")

    async def _read(self, node: SSHNode, path: str, offset: int) -> bytes:
        async def work(conn: Any) -> bytes:
            sftp = await self._sftp_of(conn)
            try:
                async with sftp.open(path, "rb") as fh:
                    await fh.seek(offset)
                    return bytes(await fh.read(READ_LIMIT))
            except asyncssh.SFTPNoSuchFile:
                return b""

        return await self._guarded(node, work)

    # -- start -------------------------------------------------------------------------
    async def _start(self, handle: RunHandle) -> int:
        node = SSHNode.from_dict(self.node_of(handle))
        try:
            return await self._dispatch(handle, node)
        except _Unreachable as exc:
            raise DispatchError(f"cannot dispatch run {handle.run_id}: {exc}") from exc

    async def _dispatch(self, handle: RunHandle, node: SSHNode) -> int:
        spec = load_spec(handle.spec_path)
        plan = UploadPlan(await self._workdir(node), handle, self.runner_package, spec)
        # The workdir's lock first: nothing is hashed, sent or removed under a live runner.
        launcher = await self._lock(node, plan)
        try:
            hashes = parse_hashes(await self._exec(node, plan.hash_command(node.python)),
                                  node.where, node.python)
            sent, files = await self._upload(node, plan, hashes)
            self.uploaded_files[handle.run_id] = files
            sent["run"] = await self._put_bytes(node, plan.run_files(handle))
            self.uploaded[handle.run_id] = sent
            layout = plan.layout(node, sent)
            # Before the launch: a bot that dies from here on still finds the run directory.
            write_layout(handle.run_dir / "remote.json", layout)
            pid = await self._launch(node, launcher)
        except BaseException:
            await _release(launcher)
            raise
        write_layout(handle.run_dir / "remote.json", {**layout, "pid": pid})
        return pid

    async def _lock(self, node: SSHNode, plan: UploadPlan) -> Any:
        """Start the node's launcher: it holds the workdir's lock until told to launch."""
        async def work(conn: Any) -> tuple[Any, str]:
            proc = await conn.create_process(plan.launch_command(node.python, plan.resume))
            return proc, await proc.stdout.readline()

        launcher, reply = await self._guarded(node, work)
        try:
            lock_holder(reply, node.where, plan.workdir, node.python)
        except DispatchError:
            await _release(launcher)
            raise
        return launcher

    async def _launch(self, node: SSHNode, launcher: Any) -> int:
        async def work(conn: Any) -> str:
            launcher.stdin.write("launch\n")
            return str(await launcher.stdout.read())

        return launched_pid(await self._guarded(node, work), node.where)

    async def _workdir(self, node: SSHNode) -> str:
        workdir = node.workdir
        if workdir.startswith("/"):
            return workdir.rstrip("/") or "/"
        home = (await self._exec(node, "pwd")).strip()
        return posixpath.join(home, workdir[2:] if workdir.startswith("~/") else workdir)

    async def _upload(self, node: SSHNode, plan: UploadPlan,
                      remote: dict[str, dict[str, str]]) -> tuple[dict[str, int], list[str]]:
        changes = plan.changes(remote)
        todo, stale = changes.send, changes.remove

        async def work(conn: Any) -> None:
            sftp = await self._sftp_of(conn)
            for parent in sorted({posixpath.dirname(dst) for _, dst in todo}):
                await sftp.makedirs(parent, exist_ok=True)
            # many small files: keep several SFTP requests in flight, not one at a time
            for i in range(0, len(todo), 16):
                await asyncio.gather(*(sftp.put(str(src), dst) for src, dst in todo[i:i + 16]))
            for i in range(0, len(stale), 16):
                await asyncio.gather(*(sftp.remove(path) for path in stale[i:i + 16]))

        await self._guarded(node, work)
        return changes.sent, [dst for _, dst in todo]

    async def _put_bytes(self, node: SSHNode, files: dict[str, bytes]) -> int:
        async def work(conn: Any) -> None:
            sftp = await self._sftp_of(conn)
            for path, data in files.items():
                await sftp.makedirs(posixpath.dirname(path), exist_ok=True)
                async with sftp.open(path, "wb") as fh:
                    await fh.write(data)

        await self._guarded(node, work)
        return sum(len(d) for d in files.values())

    # -- state and results -------------------------------------------------------------
    def _probe(self, handle: RunHandle) -> str:
        node, layout = locate(handle)
        if not self.backoff.may_try(conn_key(node)):
            return "unknown"
        command = probe_command(layout.get("pid"), layout["run_dir"])
        try:
            return self._call(self._exec(node, command), 60).strip() or "unknown"
        except _Unreachable:
            return "unknown"

    async def _fetch(self, handle: RunHandle, node: SSHNode, layout: dict[str, Any]) -> None:
        run_dir = layout["run_dir"]
        evidence = layout.get("evidence") or {}

        async def work(conn: Any) -> None:
            sftp = await self._sftp_of(conn)
            for name in await sftp.listdir(run_dir):
                if name not in (".", "..", "spec.json"):
                    await sftp.get(f"{run_dir}/{name}", str(handle.run_dir), recurse=True)
            if evidence.get("local"):
                src = f"{evidence['remote']}/{handle.run_id}"
                if await sftp.exists(src):
                    dest = Path(evidence["local"])
                    dest.mkdir(parents=True, exist_ok=True)
                    await sftp.get(src, str(dest), recurse=True)

        try:
            await self._guarded(node, work)
        except _Unreachable as exc:
            raise DispatchError(f"cannot fetch the results of {handle.run_id}: {exc}") from exc
        except OSError as exc:
            raise DispatchError(f"cannot write the results of {handle.run_id}: {exc}") from exc
        if evidence.get("local"):
            verify_fetched(handle, Path(evidence["local"]) / handle.run_id)


class _Unreachable(DispatchError):
    """The node could not be reached now (a retry later may work)."""


async def _release(launcher: Any) -> None:
    """Close the launcher's stdin: unless it launched, it drops the lock and exits."""
    try:
        launcher.stdin.write_eof()
        await asyncio.wait_for(launcher.wait(), 10)
    except (OSError, asyncssh.Error, asyncio.TimeoutError):
        launcher.close()

