"""Each volume node's copy over two real loopback sshd's (issue 23, "a million inputs"):
one archive stream per node, the nodes' streams at the same time, and a corpus already on
the nodes (``volume.inputs.on_nodes``) checked there and used in place, never uploaded.

The SSH dispatcher's own ``_prepare_all`` runs for real (locks, hashes, the tar stream,
the node's listing); the card proof and Ray that follow it are tested elsewhere
(test_volume_service.py).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.inputs_check import record_inputs
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError, NodeUnreachable
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.nodes.ssh.node import release_launcher
from bot.nodes.ssh.transfer import TransferLimits
from tests.processes import live_processes
from tests.remote.sshd_server import FAKE_RUNNER, Sshd

COUNT = 24
SIZE = 64 << 10


class Counting(SSHDispatcher):
    """Keeps every remote path each node's archive carried (what was uploaded)."""

    streamed: list[str]

    async def _stream(self, node: SSHNode, launcher: Any, send: list[tuple[Path, str]],
                      data: dict[str, bytes], workdir: str = "",
                      report: Callable[[int, int], None] | None = None) -> None:
        self.streamed += [dst for _src, dst in send] + list(data)
        await super()._stream(node, launcher, send, data, workdir, report)


def dispatcher(nodes: list[Sshd], known_hosts: Path) -> Counting:
    known_hosts.write_text("".join(n.known_hosts.read_text() for n in nodes))
    out = Counting(known_hosts=known_hosts, client_keys=[n.user_key for n in nodes],
                   use_agent=False, runner_package=FAKE_RUNNER, backoff=(0.05, 0.5))
    out.streamed = []
    return out


def volume_run(tmp_path: Path, nodes: list[dict[str, Any]], on_nodes: str | None,
               steps: list[tuple[float, dict[str, Any]]],
               on_step: Any = None) -> RunHandle:
    """A volume run's directory on the bot host: its spec, manifest and checked inputs;
    the corpus (``COUNT`` files of ``SIZE`` bytes) in the project's ``corpus`` folder."""
    project, run_dir = tmp_path / "project", tmp_path / "bot" / "runs" / "v1"
    (project / "corpus").mkdir(parents=True)
    (project / "app.py").write_text("VALUE = 1\n")
    for i in range(COUNT):
        (project / "corpus" / f"item-{i:05d}.txt").write_bytes(bytes([i]) * SIZE)
    run_dir.mkdir(parents=True)
    inputs = {"dir": str(project / "corpus"), "pattern": "item-*.txt"}
    spec = {"project": {"dir": str(project), "requirements": None}, "inputs": inputs,
            "results": {}, "volume": {"gpus": False}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    volume: dict[str, Any] = {"inputs": {"dir": "corpus", "pattern": "item-*.txt",
                                         "expected_count": COUNT}, "nodes": nodes}
    if on_nodes:
        volume["inputs"]["on_nodes"] = on_nodes
    (run_dir / "manifest.yaml").write_text(json.dumps({"node": nodes[0], "volume": volume}))
    record_inputs(run_dir, inputs["dir"], inputs["pattern"])

    def progress(step: dict[str, Any]) -> None:
        steps.append((time.monotonic(), dict(step)))
        if on_step is not None:
            on_step(step)

    return RunHandle("v1", run_dir, run_dir / "spec.json", project, progress=progress)


def prepare(d: SSHDispatcher, handle: RunHandle, nodes: list[dict[str, Any]]) -> list[Any]:
    held: list[tuple[SSHNode, Any]] = []
    try:
        return d._call(d._prepare_all(handle, [SSHNode.from_dict(n) for n in nodes], held),
                       120)
    finally:
        for _node, launcher in held:
            d._call(release_launcher(launcher), 30)
        d.close()


def test_two_nodes_get_their_archives_at_the_same_time_with_progress(
        tmp_path: Path, sshd: Sshd, sshd2: Sshd) -> None:
    nodes = [sshd.node(tmp_path / "n0"), sshd2.node(tmp_path / "n1")]
    steps: list[tuple[float, dict[str, Any]]] = []
    began = {0: threading.Event(), 1: threading.Event()}

    def meet(step: dict[str, Any]) -> None:
        # Each node's stream, once begun, waits for the other's to begin: streams sent one
        # after another would never meet (the wait would time out and the test fail).
        if step["phase"] == "uploading" and step["bytes_done"] == 0:
            began[step["index"]].set()
            assert began[1 - step["index"]].wait(30), "the other node's upload never began"

    handle = volume_run(tmp_path, nodes, None, steps, meet)
    copies = prepare(dispatcher([sshd, sshd2], tmp_path / "known_hosts"), handle, nodes)
    assert [c.run_dir for c in copies] == [f"{tmp_path}/n{i}/runs/v1" for i in (0, 1)]
    first = {i: min(t for t, s in steps if s["index"] == i and s["phase"] == "uploading")
             for i in (0, 1)}
    done = {i: max(t for t, s in steps if s["index"] == i and s["phase"] == "uploaded")
            for i in (0, 1)}
    assert first[0] < done[1] and first[1] < done[0]  # the two streams overlapped
    for i in (0, 1):
        progress = [s for _t, s in steps if s["index"] == i and s["phase"] == "uploading"]
        total = progress[0]["bytes_total"]
        assert total > COUNT * SIZE and progress[-1]["bytes_done"] == total
        corpus = next((tmp_path / f"n{i}" / "projects").glob("project-*")) / "corpus"
        assert sorted(p.name for p in corpus.iterdir()) == [f"item-{n:05d}.txt"
                                                            for n in range(COUNT)]


def test_a_corpus_on_the_nodes_is_checked_there_and_used_in_place(
        tmp_path: Path, sshd: Sshd, sshd2: Sshd) -> None:
    shared = tmp_path / "shared" / "corpus"  # the same path on both nodes (one host here)
    nodes = [sshd.node(tmp_path / "n0"), sshd2.node(tmp_path / "n1")]
    steps: list[tuple[float, dict[str, Any]]] = []
    handle = volume_run(tmp_path, nodes, str(shared), steps)
    shutil.copytree(tmp_path / "project" / "corpus", shared)
    d = dispatcher([sshd, sshd2], tmp_path / "known_hosts")
    copies = prepare(d, handle, nodes)
    assert not [p for p in d.streamed if "item-" in p]  # not one input uploaded
    sent = {s["index"]: s["bytes"] for _t, s in steps if s["phase"] == "uploaded"}
    assert set(sent) == {0, 1} and max(sent.values()) < SIZE  # the runner and the specs
    for i, copy in enumerate(copies):
        spec = json.loads(Path(copy.run_dir, "spec.json").read_text())
        assert spec["inputs"]["dir"] == str(shared)
        assert not list((tmp_path / f"n{i}").rglob("item-*"))


def test_a_node_whose_copy_differs_is_refused_naming_it_and_the_input(
        tmp_path: Path, sshd: Sshd, sshd2: Sshd) -> None:
    shared = tmp_path / "shared" / "corpus"
    nodes = [sshd.node(tmp_path / "n0"), sshd2.node(tmp_path / "n1")]
    handle = volume_run(tmp_path, nodes, str(shared), [])
    shutil.copytree(tmp_path / "project" / "corpus", shared)
    (shared / "item-00007.txt").write_bytes(b"\x07" * (SIZE - 1) + b"!")  # same size
    with pytest.raises(DispatchError) as refused:
        prepare(dispatcher([sshd, sshd2], tmp_path / "known_hosts"), handle, nodes)
    assert str(refused.value).startswith(
        f"{sshd.user}@127.0.0.1:{sshd.port}: its copy of the corpus at "
        f"volume.inputs.on_nodes {shared} differs from the bot's volume.inputs.dir: first "
        "differing input 'item-00007' "
        "(item-00007.txt: its SHA-256 differs)")


def test_a_node_whose_upload_stalls_fails_after_the_stall_limit_naming_it(
        tmp_path: Path, sshd: Sshd) -> None:
    """The node stops reading the archive as its stream begins (its launcher stopped,
    SIGSTOP): the copy fails once no byte moved for the stall limit (1 s here), naming
    the node, the phase and the bytes moved, with no wall limit in the way."""
    nodes = [sshd.node(tmp_path / "n0")]
    lock = f"{tmp_path}/n0/dispatch.lock".encode()
    stopped: list[int] = []

    def stop_node(step: dict[str, Any]) -> None:
        if step["phase"] == "uploading" and step["bytes_done"] == 0 and not stopped:
            for proc in live_processes():  # the launcher (and its shell) reading the stream
                if lock in proc.cmdline:
                    os.kill(proc.pid, signal.SIGSTOP)
                    stopped.append(proc.pid)
            assert stopped, "no launcher found on the node"

    handle = volume_run(tmp_path, nodes, None, [], stop_node)
    # far more than the SSH channel's window and the pipe's buffer can hold
    (tmp_path / "project" / "big.bin").write_bytes(os.urandom(1 << 20) * 48)
    d = dispatcher([sshd], tmp_path / "known_hosts")
    d.transfer_limits = TransferLimits(stall_s=1.0)
    try:
        with pytest.raises(NodeUnreachable) as stalled:
            d._volume_cluster(handle, [SSHNode.from_dict(n) for n in nodes])
        # the stalled node's connection was dropped: the next try starts afresh
        assert not d._conns
    finally:
        for pid in stopped:  # gone already if its session was closed meanwhile
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        d.close()
    message = str(stalled.value)
    assert message.startswith(f"{sshd.user}@127.0.0.1:{sshd.port}: the upload to "
                              "volume.nodes[0] stalled: no byte moved for "), message
    moved = re.search(r"\((.+) of (.+) moved; the stall limit is 1 s", message)
    assert moved is not None and float(moved.group(2).split()[0]) > 48, message
    assert moved.group(1) != moved.group(2)  # it stopped part of the way
