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
- The follower (``read_events``, ``is_alive``, ``exit_code``, ``log_tail``, ``stop``,
  ``clean_up``) is ``NodeDispatcher``'s, over the SSH adapter (``adapter.py``): the
  events read over SFTP from a byte offset and mirrored locally; after a drop the node is
  reconnected with exponential backoff, and while the backoff says not to try the
  adapter raises ``NodeUnreachable`` (``is_alive`` says yes: unknown is not dead).
- ``fetch_results`` mirrors the remote run directory back and, when ``results.copy_to`` is
  a path on the bot host, brings the evidence copy back there and verifies it (streamed,
  resumed after a cut: ``fetch.py``).

The service calls these methods synchronously; the SSH work runs on a private event loop
thread. Call ``close`` when done. What is sent and run on the node, and the local files,
are ``bot/dispatch/upload.py``'s; the launcher's protocol on one node ``node.py``'s, the
sessions themselves ``session.py``'s.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from bot.dispatch.base import RunHandle
from bot.dispatch.card_proof import NodeCopy, proof_files
from bot.dispatch.corpus import check_listing, listing_cap
from bot.dispatch.corpus_head import list_on_head
from bot.dispatch.node_dispatcher import NodeDispatcher
from bot.dispatch.plan import plan_of
from bot.dispatch.upload import (
    SSHNode,
    UploadPlan,
    locate,
    node_section,
    write_layout,
)
from bot.dispatch.volume_cluster import (
    RayNodeOf,
    VolumeStart,
    default_ray_node,
    end_earlier_cluster,
    start_volume_cluster,
    stop_volume_cluster,
    volume_nodes,
)
from bot.errors import DispatchError, NodeUnreachable
from bot.manifest.nodes import NodeSpec
from bot.node_programs.ray_hold import HOLD_ENV
from bot.nodes.base import Node
from bot.nodes.ssh import KIND
from bot.nodes.ssh.adapter import SSHAdapter
from bot.nodes.ssh.fetch import FetchLimits, fetch_results
from bot.nodes.ssh.node import SSHNodes, release_launcher
from bot.nodes.ssh.transfer import TransferLimits, TransferWatch, use_meter

log = logging.getLogger(__name__)
T = TypeVar("T")
# Volume nodes whose copy is made at the same time: ten nodes one after another took far
# longer than a start may, and all at once would saturate the bot host's uplink.
PREPARE_AT_ONCE = 4
# The fixed parts of the copies' ceilings (bot/nodes/ssh/transfer.py): the steps that move no
# bytes (sessions, the lock, the node hashing its copy, launching); the bytes to move add
# their time at the floor rate, and a transfer that stalls fails after the stall limit.
DISPATCH_FIXED_S = 600.0
PREPARE_FIXED_S = 900.0  # per PREPARE_AT_ONCE nodes
FETCH_FIXED_S = 900.0


class SSHDispatcher(SSHNodes, NodeDispatcher):
    """``NodeDispatcher`` over the SSH adapter (its ``node_of`` is ``adapter``): the
    follower (events, probe, exit code, log tail, stop, a volume's Ray stopped) is
    ``NodeDispatcher``'s; the start (the held upload conversation, a volume's copies) and
    the fetch (streamed, resumable) are this class's own, over what ``SSHNodes`` does on a
    node, itself over the sessions of ``SSHSessions``."""

    def __init__(self, *, known_hosts: Path | str | None = None,
                 client_keys: Sequence[Path | str] | None = None,
                 ssh_config: Path | str | None = None, use_agent: bool = True,
                 runner_package: Path | None = None, connect_timeout: float = 15.0,
                 backoff: tuple[float, float] = (0.25, 30.0), attempts: int = 4,
                 section_of: Callable[[RunHandle], dict[str, Any]] | None = None,
                 ray_node: RayNodeOf = default_ray_node,
                 fetch_limits: FetchLimits | None = None,
                 transfer_limits: TransferLimits | None = None,
                 keep_out: Sequence[Path | str] = ()) -> None:
        super().__init__(known_hosts=known_hosts, client_keys=client_keys,
                         ssh_config=ssh_config, use_agent=use_agent,
                         connect_timeout=connect_timeout, backoff=backoff)
        NodeDispatcher.__init__(self, self.adapter, runner_package=runner_package,
                                ray_node=ray_node, keep_out=keep_out)
        self.attempts = attempts  # tries of a dispatch and of a results fetch
        self.fetch_limits = fetch_limits or FetchLimits()  # the most a fetch brings back
        # when a copy to or from a node has failed: its stall limit and floor rate
        self.transfer_limits = transfer_limits or TransferLimits()
        self.section_of = section_of or node_section  # a run's node section
        self.uploaded: dict[str, dict[str, int]] = {}  # run id -> bytes by kind
        self.uploaded_files: dict[str, list[str]] = {}  # run id -> remote paths written

    # -- the Dispatcher protocol -----------------------------------------------------
    def start(self, handle: RunHandle) -> int | None:
        """A several-node volume first gets the run into every node's own workdir, its
        cards proven there, and Ray started on them; the token reaches the driver through
        the launcher's standard input only. A failed dispatch stops that Ray. An answer of
        a node that cannot be read (JSON of the wrong shape) is a DispatchError naming the
        run's node, never a bare error."""
        try:
            return self._start(handle)
        except (ValueError, TypeError, KeyError, AttributeError, IndexError) as exc:
            where = (handle.node or {}).get("host") or "its node"
            raise DispatchError(f"run {handle.run_id}: an answer of {where} cannot be read "
                                f"({type(exc).__name__}: {exc}); nothing was started") from exc

    def _start(self, handle: RunHandle) -> int | None:
        env: dict[str, str] = {}
        spec = plan_of(handle).spec()  # a volume head's: the cluster's (VolumeStart.spec)
        nodes = [self.adapter(spec).node for spec in volume_nodes(handle, KIND)]
        # a corpus only the nodes hold: the head's listing first, every node's reference
        head = nodes[0] if nodes else SSHNode.from_dict(self.section_of(handle))
        list_on_head(SSHAdapter(self, head), handle)
        if nodes:
            end_earlier_cluster(self.adapter, handle)  # a resume: nothing is sent under it
            started = self._volume_cluster(handle, nodes)
            env, spec = started.cluster.driver_env(), started.spec
        try:
            node = SSHNode.from_dict(self.section_of(handle))
            if nodes:  # the last step a stop can still end before the driver starts
                handle.progress({"node": node.where, "index": 0, "phase": "launching"})
            watch = TransferWatch(self.transfer_limits, DISPATCH_FIXED_S)
            return self._call(self.watched(
                self._tries(f"dispatch run {handle.run_id}",
                            lambda: self._dispatch(handle, node, env, spec)),
                watch, watch.meter(node.where, "upload"), [node]), None)
        except BaseException:
            stop_volume_cluster(self.adapter, handle)
            raise

    def adapter(self, spec: NodeSpec) -> SSHAdapter:
        """A node section's node as a ``Node`` (``adapter.py``), over these sessions."""
        return SSHAdapter.of(self, spec)

    def fetch_results(self, handle: RunHandle) -> Path | None:
        """The run has ended: its volume's Ray (if any) is stopped on every node first. The
        copy runs as long as bytes move (``bot/nodes/ssh/transfer.py``)."""
        self._stop_cluster(handle)
        node, layout = locate(handle)
        watch = TransferWatch(self.transfer_limits, FETCH_FIXED_S)
        return self._call(self.watched(fetch_results(self, handle, node, layout), watch,
                                       watch.meter(node.where, "results fetch"), [node]),
                          None)

    # -- start -------------------------------------------------------------------------
    def _volume_cluster(self, handle: RunHandle, nodes: list[SSHNode]) -> VolumeStart:
        """Each node's own copy of the run, then its card proof and Ray, each step reported
        per node (``handle.progress``). The copies are made ``PREPARE_AT_ONCE`` nodes at a
        time. The nodes other than the head keep their workdir's lock from the copy on: a
        holder launched there keeps it while their Ray lives (the head's is taken again to
        launch the driver)."""
        held: list[tuple[SSHNode, Any]] = []
        watch = TransferWatch(self.transfer_limits,
                              PREPARE_FIXED_S * -(-len(nodes) // PREPARE_AT_ONCE))
        try:
            copies = self._call(self.watched(self._prepare_all(handle, nodes, held, watch),
                                             watch, nodes=nodes), None)
            started = start_volume_cluster(self.adapter, handle, copies, self.ray_node)
            if started is None:
                raise DispatchError(f"run {handle.run_id}: volume.nodes changed meanwhile")
        except BaseException:
            for _node, launcher in held:
                self._call(release_launcher(launcher), 30)
            raise
        for (node, launcher), ray in zip(held, started.cluster.nodes[1:]):
            try:
                self._call(self._launch(node, launcher, {HOLD_ENV: ray.temp_dir}), 60)
            except DispatchError as exc:  # the volume can run; only the lock is lost
                log.warning("run %s: %s keeps no workdir lock during the run: %s",
                            handle.run_id, node.where, exc)
        return started

    async def _prepare_all(self, handle: RunHandle, nodes: list[SSHNode],
                           held: list[tuple[SSHNode, Any]],
                           watch: TransferWatch | None = None) -> list[NodeCopy]:
        """Every node's own copy, ``PREPARE_AT_ONCE`` at a time; the launchers that hold a
        lock go into ``held`` (in node order) once every node is done, or is cancelled.
        The first failure in node order is raised once every node is done. ``watch``
        meters each node's upload (``upload to volume.nodes[i]``)."""
        gate = asyncio.Semaphore(PREPARE_AT_ONCE)
        launchers: dict[int, Any] = {}

        async def one(i: int, node: SSHNode) -> NodeCopy:
            if watch is not None:  # this node's task only (each runs in a task of its own)
                use_meter(watch.meter(node.where, f"upload to volume.nodes[{i}]"))
            async with gate:
                plan, launcher, sent = await self._tries(
                    f"prepare volume.nodes[{i}] for run {handle.run_id}",
                    partial(self._prepare, handle, node, i > 0, i))
            if launcher is not None:
                launchers[i] = launcher
            await asyncio.to_thread(handle.progress, {
                "node": node.where, "index": i, "phase": "uploaded",
                "bytes": sum(sent.values())})
            return NodeCopy.of(plan)

        try:
            results = await asyncio.gather(*(one(i, n) for i, n in enumerate(nodes)),
                                           return_exceptions=True)
        finally:  # a watch that stopped the copies still releases their launchers
            held.extend((nodes[i], launchers[i]) for i in sorted(launchers))
        for result in results:
            if isinstance(result, BaseException):
                raise result
        return [r for r in results if isinstance(r, NodeCopy)]

    async def _tries(self, what: str, make: Callable[[], Awaitable[T]]) -> T:
        """``make()``; a drop redoes it (a dispatch sends again only what differs)."""
        for attempt in range(self.attempts):
            try:
                return await make()
            except NodeUnreachable as exc:
                if attempt + 1 == self.attempts:
                    raise NodeUnreachable(f"cannot {what} after {self.attempts} tries: "
                                          f"{exc}") from exc
                await asyncio.sleep(self.backoff.delay(attempt))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    async def _prepare(self, handle: RunHandle, node: SSHNode, hold: bool,
                       index: int = 0) -> tuple[UploadPlan, Any, dict[str, int]]:
        """One volume node's own copy of the run (runner, project, inputs, spec and the
        card proof's spec) in its own workdir, sent under that workdir's lock, and the
        bytes sent by kind; with ``hold`` the launcher that holds the lock is returned,
        still holding it. Its archive's progress is reported as ``uploading`` steps of
        ``volume.nodes[index]`` (bytes done of bytes in all)."""
        def report(done: int, total: int) -> None:
            handle.progress({"node": node.where, "index": index, "phase": "uploading",
                             "bytes_done": done, "bytes_total": total})

        plan = UploadPlan(await self._workdir(node), handle, self.runner_package,
                          plan_of(handle).spec())
        launcher, hashes = await self._lock(node, plan, plan.hold_command(node.python) if hold
                                            else None)
        try:
            sent, _files = await self._send(node, plan, handle, launcher, hashes,
                                            proof_files(plan), report)
        except BaseException:
            await release_launcher(launcher)
            raise
        if not hold:
            await release_launcher(launcher)
        return plan, launcher if hold else None, sent

    async def _send(self, node: SSHNode, plan: UploadPlan, handle: RunHandle, launcher: Any,
                    hashes: dict[str, dict[str, str]], extra: dict[str, bytes],
                    report: Callable[[int, int], None] | None = None
                    ) -> tuple[dict[str, int], list[str]]:
        """What differs from the node's copy (``hashes``, read by the launcher under the
        lock), then the run's own files (and ``extra``), all written by the launcher from
        one archive stream."""
        changes = plan.changes(hashes)
        run_files = {**plan.run_files(handle), **extra}
        await self._stream(node, launcher, changes.send, run_files, workdir=plan.workdir,
                           report=report)
        if changes.remove:
            await self._remove(node, changes.remove)
        if plan.on_nodes:  # the corpus is the node's own: it must equal the bot's copy
            command, reference = await asyncio.to_thread(plan.corpus_check, node.python)
            reply = await self._exec(node, command, cap=listing_cap(reference.count))
            check_listing(node.where, plan.on_nodes, reference, reply, head=plan.head)
        return {**changes.sent, "run": sum(len(d) for d in run_files.values())}, \
            [dst for _, dst in changes.send]

    async def _dispatch(self, handle: RunHandle, node: SSHNode, env: dict[str, str],
                        spec: dict[str, Any]) -> int | None:
        """``spec``: the run's (a volume head's with its cluster), rewritten for the node."""
        plan = UploadPlan(await self._workdir(node), handle, self.runner_package, spec)
        # The workdir's lock first: nothing is hashed, sent or removed under a live runner.
        # Nothing else is opened before the launch: the SFTP channel the follower reads the
        # events with (a session of its own, with the login shell's start-up) is opened by
        # its first read. Started beside the launcher's session it slowed the lock by about
        # 0.1 s on a 2-core machine, started after the lock it slowed the upload.
        launcher, hashes = await self._lock(node, plan)
        return await self._send_and_launch(handle, node, env, plan, launcher, hashes)

    async def _send_and_launch(self, handle: RunHandle, node: SSHNode, env: dict[str, str],
                               plan: UploadPlan, launcher: Any,
                               hashes: dict[str, dict[str, str]]) -> int | None:
        try:
            sent, files = await self._send(node, plan, handle, launcher, hashes, {})
            self.uploaded_files[handle.run_id] = files
            self.uploaded[handle.run_id] = sent
            layout = plan.layout(node, sent)
            # Before the launch: a bot that dies from here on still finds the run directory.
            write_layout(handle.run_dir / "remote.json", layout)
        except BaseException:
            await release_launcher(launcher)
            raise
        try:
            pid = await self._launch(node, launcher, env)
        except NodeUnreachable:
            # Cut off around "launch": the runner may have started. No pid in remote.json:
            # the probe then reads the node's runner.pid (docs/remote.md, "starting").
            return None
        write_layout(handle.run_dir / "remote.json", {**layout, "pid": pid})
        return pid

    # -- where -------------------------------------------------------------------------
    def _located(self, handle: RunHandle) -> tuple[Node, dict[str, Any]]:
        """The run's node (the handle's, else the one ``remote.json`` recorded: ``locate``)
        as a ``Node`` over these sessions, and the run's layout there."""
        node, layout = locate(handle)
        return SSHAdapter(self, node), layout
