"""NodeDispatcher: the Dispatcher protocol written once against ``bot.nodes.base.Node``.

A kind that supplies a ``Node`` (run a command, send the launcher its stream, read a file,
probe, stop) gets a start, a follower and a fetch from here: the run's files go to the
node's workdir as one archive on the launcher's standard input, under the workdir's lock
(``bot/node_programs/launcher.py``: ``hash`` makes the folders, ``tar`` unpacks, ``launch``
starts the runner detached); ``remote.json`` keeps where the run is on the node and the
runner's pid; the events are read from the node's ``events.jsonl`` by byte offset and
mirrored into the run directory; the results are brought back file by file (the bot's own
records never replaced). A several-node volume (``volume.nodes``, all of the head's kind)
first gets a copy of the run into every node's workdir, then the card proofs and Ray on
every node (``volume_cluster.py``, as the SSH adapter's), the driver handed the cluster's
token on the launch line only; Ray is stopped on every node by a stop, ``clean_up`` or the
fetch. A corpus already on the nodes (``volume.inputs.on_nodes``) is listed on the head
first when only the nodes hold it (``corpus_head.list_on_head``), and every node's copy is
checked against its reference once the node has its copy of the run, before the launch
(``corpus_head.check_on_node``). The nodes other than the head lock their workdir again
once their Ray is up, for as long as it lives (the launcher's hold, ``ray_hold.py``; a
node whose lock is taken meanwhile is warned of and the volume runs, as on SSH, where the
lock is kept from the copy on). An evidence home on the bot host (``results.copy_to``)
gets the node's evidence copy, checked and verified, at the fetch (``node_fetch.py``).
What it does differently from the SSH kind's: docs/architecture.md, "Adding a node kind".
"""

from __future__ import annotations

import io
import json
import logging
import posixpath
import shlex
import tarfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bot.dispatch.base import LOG_TAIL_BYTES, RunHandle, events_error, json_object
from bot.dispatch.card_proof import NodeCopy, proof_files
from bot.dispatch.corpus_head import check_on_node, list_on_head
from bot.dispatch.node_fetch import fetch_over_node
from bot.dispatch.plan import plan_of
from bot.dispatch.upload import RUNNER_PACKAGE, UploadPlan, mirror, write_layout
from bot.dispatch.volume_cluster import (
    RayNodeOf,
    default_ray_node,
    end_earlier_cluster,
    start_volume_cluster,
    stop_volume_cluster,
    volume_nodes,
)
from bot.errors import DispatchError, NodeUnreachable
from bot.manifest.nodes import NodeSpec
from bot.node_programs.ray_hold import HOLD_ENV
from bot.nodes.base import Node, TailReader
from runner.events import (
    READ_WINDOW_MAX,
    Event,
    EventFormatError,
    parse_chunk,
    read_complete,
)

log = logging.getLogger(__name__)
CHUNK = 1 << 20  # bytes per framed chunk of the archive on the launcher's stdin


class NodeDispatcher:
    """The runner on a node reached through ``node_of`` (the kind's adapter: a node spec
    → its ``Node``)."""

    def __init__(self, node_of: Callable[[NodeSpec], Node], *,
                 runner_package: Path | None = None,
                 ray_node: RayNodeOf = default_ray_node,
                 keep_out: Sequence[Path | str] = ()) -> None:
        self.node_of = node_of
        self.runner_package = Path(runner_package or RUNNER_PACKAGE)
        self.ray_node = ray_node  # a several-node volume's Ray layout (volume_cluster.py)
        # the bot's own folders (its runs folder, its state) no evidence home may touch
        self.keep_out = tuple(Path(p) for p in keep_out)

    # -- the Dispatcher protocol -----------------------------------------------------
    def start(self, handle: RunHandle) -> int | None:
        spec_node, node = self._node(handle)
        specs = volume_nodes(handle, spec_node.kind)
        # a corpus only the nodes hold: the head's listing first, every node's reference
        list_on_head(self.node_of(specs[0]) if specs else node, handle)
        if not specs:
            return self._launch_runner(handle, spec_node, node, {}, plan_of(handle).spec())
        end_earlier_cluster(self.node_of, handle)  # a resume: nothing is sent under it
        try:
            uploads = [self._copy(handle, i, s, self.node_of(s)) for i, s in enumerate(specs)]
            started = start_volume_cluster(self.node_of, handle,
                                           [NodeCopy.of(u) for u in uploads], self.ray_node)
            if started is None:
                raise DispatchError(f"run {handle.run_id}: volume.nodes changed meanwhile")
            for spec, upload, ray in list(zip(specs, uploads, started.cluster.nodes))[1:]:
                self._hold(handle, self.node_of(spec), upload, ray.temp_dir)
            handle.progress({"node": self.node_of(specs[0]).where, "index": 0,
                             "phase": "launching"})
            return self._launch_runner(handle, spec_node, node, started.cluster.driver_env(),
                                started.spec)
        except BaseException:
            stop_volume_cluster(self.node_of, handle)
            raise

    def _upload(self, handle: RunHandle, spec_node: NodeSpec, node: Node,
                spec: dict[str, Any]) -> tuple[UploadPlan, dict[str, bytes], dict[str, int]]:
        """What goes to the node: the plan, every file (node path → bytes: a fresh copy,
        nothing asked of the node first), and the bytes by kind; ``spec`` is the run's
        (its launch plan's, or a volume head's with its cluster), rewritten for the node."""
        workdir = self._node_workdir(spec_node, node)
        upload = UploadPlan(workdir, handle, self.runner_package, spec)
        changes = upload.changes({})
        files = {**{dst: src.read_bytes() for src, dst in changes.send},
                 **upload.run_files(handle)}
        return upload, files, {**changes.sent, "run": sum(len(d) for d in files.values())}

    def _copy(self, handle: RunHandle, index: int, spec_node: NodeSpec,
              node: Node) -> UploadPlan:
        """Volume node ``index``'s own copy of the run (with its card proof's spec), sent
        under its workdir's lock, which is let go once it is written; where it went."""
        upload, files, sent = self._upload(handle, spec_node, node, plan_of(handle).spec())
        files.update(proof_files(upload))
        stream = (upload.hash_request().encode() + b"tar\n"
                  + _framed(_tar(files, upload.workdir)))  # no launch: the lock is let go
        out = node.send_archive(upload.launch_command(node.python, False), stream)
        _locked(out, node.where, upload.workdir)
        check_on_node(node, upload)  # its own copy of a corpus on the nodes, if any
        handle.progress({"node": node.where, "index": index, "phase": "uploaded",
                         "bytes": sum(sent.values())})
        return upload

    @staticmethod
    def _hold(handle: RunHandle, node: Node, upload: UploadPlan, temp_dir: str) -> None:
        """A volume node other than the head: its workdir's lock taken again, held by the
        launcher's hold for as long as the node's Ray (its group, in ``temp_dir``) lives.
        A lock it cannot take is warned of: the volume can run, only the lock is lost."""
        stream = f"launch {json.dumps({HOLD_ENV: temp_dir})}\n".encode()
        try:
            _launched(node.send_archive(upload.hold_command(node.python), stream),
                      node.where, upload.workdir)
        except (DispatchError, NodeUnreachable) as exc:
            log.warning("run %s: %s keeps no workdir lock during the run: %s",
                        handle.run_id, node.where, exc)

    def _launch_runner(self, handle: RunHandle, spec_node: NodeSpec, node: Node,
                env: dict[str, str], spec: dict[str, Any]) -> int:
        upload, files, sent = self._upload(handle, spec_node, node, spec)
        check_on_node(node, upload)  # before the runner starts on it
        launch = f"launch {json.dumps(env)}\n" if env else "launch\n"
        stream = (upload.hash_request().encode() + b"tar\n"
                  + _framed(_tar(files, upload.workdir)) + launch.encode())
        python = spec_node.python or "python3"
        layout = {"node": spec_node.model_dump(mode="json"), "run_dir": upload.remote_run_dir,
                  "pid": None, "lock": upload.lock, "python": python,
                  "evidence": upload.evidence, "uploaded": sent}
        # before the launch: a bot that dies from here on still finds the run ("starting")
        write_layout(handle.run_dir / "remote.json", layout)
        out = node.send_archive(upload.launch_command(python, handle.resume), stream)
        pid = _launched(out, node.where, upload.workdir)
        write_layout(handle.run_dir / "remote.json", {**layout, "pid": pid})
        return pid

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        """Raises ``NodeUnreachable`` while the node cannot be reached (a kind that waits
        between tries raises it while it waits): the caller decides how long to keep
        trying. A line over the reader's window is skipped, logged, the rest read."""
        node, layout = self._located(handle)
        path = layout["run_dir"] + "/events.jsonl"
        local = handle.run_dir / "events.jsonl"

        def read(at: int, size: int) -> bytes:
            try:
                return node.read_file(path, at, size)
            except FileNotFoundError:
                return b""

        chunk, start, skipped = read_complete(read, offset,
                                              keep=lambda at, data: mirror(local, at, data))
        for at, length in skipped:  # the line stays in the file (and its local copy)
            log.warning("run %s: %s on %s: the line at byte %d is %d bytes, over the "
                        "reader's %d MiB: skipped, the events after it are read",
                        handle.run_id, path, node.where, at, length, READ_WINDOW_MAX >> 20)
        try:
            events, new_offset = parse_chunk(chunk, start, expand=False)
        except EventFormatError as exc:
            raise events_error(handle, f"{path} on {node.where}", exc) from exc
        if new_offset > start:
            mirror(local, start, chunk[: new_offset - start])
        return events, new_offset

    def is_alive(self, handle: RunHandle) -> bool:
        """Whether the runner answers on its node (unreachable is not dead). It only looks:
        an ended runner's volume Ray is stopped by ``clean_up`` or ``fetch_results``."""
        node, layout = self._located(handle)
        try:
            return node.probe(layout.get("pid"), layout["run_dir"]) not in ("dead", "done")
        except NodeUnreachable:
            return True  # unknown is not dead

    def clean_up(self, handle: RunHandle) -> list[str]:
        """The runner ended, or its head is out of reach for good (the follower gave up):
        this volume's Ray (if any) is stopped on every node that answers, the others
        first; the problems met (an unreachable head's among them, the record kept with
        them so the next call tries again)."""
        try:
            return stop_volume_cluster(self.node_of, handle)
        except DispatchError as exc:
            return [str(exc)]

    def exit_code(self, handle: RunHandle) -> int | None:
        node, layout = self._located(handle)
        try:
            raw = node.read_file(layout["run_dir"] + "/exit_code")
        except (FileNotFoundError, NodeUnreachable):
            return None
        text = raw.decode("ascii", errors="replace").strip()
        return int(text) if text.isdigit() else None

    def fetch_results(self, handle: RunHandle) -> Path | None:
        """The node's run directory, file by file, into the run directory (the bot's own
        records left out), a volume's Ray stopped on every node first; an evidence home on
        the bot host gets the node's evidence copy, verified (``node_fetch.py``)."""
        self._stop_cluster(handle)
        node, layout = self._located(handle)
        return fetch_over_node(handle, node, layout, self.keep_out)

    def log_tail(self, handle: RunHandle, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of ``runner.log`` on the node ("" while the node cannot be reached):
        the node's own read of a file's tail where it has one (``TailReader``), else
        ``tail -c`` run there."""
        try:
            node, layout = self._located(handle)
            path = layout["run_dir"] + "/runner.log"
            if isinstance(node, TailReader):
                return node.read_tail(path, int(limit)).decode("utf-8", errors="replace")
            code, out, _err = node.run(f"tail -c {int(limit)} {shlex.quote(path)}", timeout=60)
        except (DispatchError, NodeUnreachable):
            return ""
        return out if code == 0 else ""

    def stop(self, handle: RunHandle) -> None:
        """Raises ``NodeUnreachable`` when the node cannot be reached: nothing was stopped.
        A run stopped while it is being started (no ``remote.json`` yet: no runner) has
        only its volume's Ray, if any, to stop on every node."""
        if (handle.run_dir / "remote.json").exists():  # else stopped while starting
            node, layout = self._located(handle)
            try:
                node.stop(layout.get("pid"), layout["run_dir"])
            except NodeUnreachable as exc:
                raise NodeUnreachable(f"cannot stop run {handle.run_id}: {exc}; its runner "
                                      "may still be running, try again") from exc
        self._stop_cluster(handle)

    def _stop_cluster(self, handle: RunHandle) -> None:
        problems = stop_volume_cluster(self.node_of, handle)
        if problems:
            raise DispatchError(f"run {handle.run_id}: Ray not stopped on every node: "
                                + "; ".join(problems))

    def close(self) -> None:
        """Nothing held open: each call of a ``Node`` stands alone."""

    # -- where ------------------------------------------------------------------------
    def _node(self, handle: RunHandle) -> tuple[NodeSpec, Node]:
        spec_node = plan_of(handle).node
        if spec_node is None:
            raise DispatchError(f"run {handle.run_id}: no node section; nothing was started")
        return spec_node, self.node_of(spec_node)

    def _located(self, handle: RunHandle) -> tuple[Node, dict[str, Any]]:
        """The run's node and its layout there (``remote.json``, written by ``start``)."""
        path = handle.run_dir / "remote.json"
        try:
            layout = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise DispatchError(f"run {handle.run_id}: {path} is missing or unreadable; "
                                "the run was never dispatched to its node") from exc
        if not isinstance(layout, dict) or not isinstance(layout.get("run_dir"), str):
            raise DispatchError(f"run {handle.run_id}: {path} names no run directory")
        return self._node(handle)[1], layout

    @staticmethod
    def _node_workdir(spec_node: NodeSpec, node: Node) -> str:
        """The node's workdir: as written when absolute, else under the node's home."""
        workdir = spec_node.workdir or "preflight"
        if workdir.startswith("/"):
            return workdir.rstrip("/") or "/"
        code, out, err = node.run("pwd", timeout=60)
        home = out.strip()
        if code != 0 or not home.startswith("/"):
            raise DispatchError(f"{node.where}: cannot tell its home folder ({err.strip()!r})")
        rel = workdir[2:] if workdir.startswith("~/") else workdir
        return posixpath.join(home, rel)


def _tar(files: dict[str, bytes], workdir: str) -> bytes:
    """One archive of ``files`` (node path → bytes), named relative to ``workdir``."""
    out = io.BytesIO()
    now = time.time()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dst, data in files.items():
            info = tarfile.TarInfo(posixpath.relpath(dst, workdir))
            info.size, info.mode, info.mtime = len(data), 0o644, now
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def _framed(data: bytes) -> bytes:
    """The archive as the launcher reads it: ``<n>`` lines, n bytes each, ``0`` at the end."""
    parts = [f"{len(data[i:i + CHUNK])}\n".encode() + data[i:i + CHUNK]
             for i in range(0, len(data), CHUNK)]
    return b"".join(parts) + b"0\n"


def _locked(out: str, where: str, workdir: str) -> list[str]:
    """The launcher's output lines, once its first says the workdir's lock is ours."""
    lines = out.strip().splitlines()
    first = json_object(lines[0]) if lines else None
    if first is None or not first.get("locked"):
        held = (first or {}).get("held")
        if isinstance(held, dict):
            raise DispatchError(f"{where}: workdir {workdir} is in use by run "
                                f"{held.get('run')}: wait for it to end, or give this "
                                "manifest another node.workdir")
        raise DispatchError(f"{where}: the launcher did not answer (got {out[:200]!r})")
    return lines


def _launched(out: str, where: str, workdir: str) -> int:
    """The runner's pid from the launcher's output: its lock line first, the pid last."""
    lines = _locked(out, where, workdir)
    try:
        return int(lines[-1])
    except ValueError as exc:
        raise DispatchError(f"{where}: the launcher printed no pid: {out[-200:]!r}") from exc
