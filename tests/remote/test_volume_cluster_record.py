"""The record of a volume's Ray nodes (``ray_cluster.json``): an earlier attempt's cluster
is stopped before a resume starts a new one, and a cluster that cannot be stopped refuses
the new start, naming why. A small fake of the dispatcher's ``run`` (no SSH)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.dispatch.base import RunHandle
from bot.dispatch.card_proof import NodeCopy
from bot.dispatch.upload import SSHNode
from bot.dispatch.volume_cluster import CLUSTER_FILE, start_volume_cluster
from bot.errors import DispatchError, NodeUnreachable
from bot.nodes.ssh.dispatcher import SSHDispatcher
from runner.raypin import RAY_VERSION
from tests.remote.remote_kit import command_kind, nodes_through


class _Node:
    """Answers like a node with the pinned Ray; records every command."""

    def __init__(self, stop_fails: bool = False) -> None:
        self.ran: list[tuple[str, str]] = []
        self.stop_fails = stop_fails

    def run(self, node: SSHNode, command: str, stdin: str = "",
            timeout: float = 120) -> tuple[int, str, str]:
        kind = command_kind(command)
        self.ran.append((kind, node.host))
        if kind == "stop" and self.stop_fails:
            return 1, "", "permission denied"
        if kind == "proof":  # a CPU node whose card stages passed
            return 0, cpu_proof(), ""
        return 0, json.dumps({"python": "3.11.9", "ray": RAY_VERSION}), ""


def cpu_proof() -> str:
    """What ``python -m runner --stages ...`` prints on a node with torch and no GPU."""
    return "".join(json.dumps({"type": "stage.passed", "stage": s, "facts": facts}) + "\n"
                   for s, facts in (("torch", {"version": "2.5.1"}),
                                    ("device", {"device": "cpu", "count": 1}),
                                    ("compute", {"device": "cpu"})))


COPIES = [NodeCopy("/w/runs/r-1", "/w/runner-pkg", "/w/projects/p") for _ in range(2)]


def _handle(tmp_path: Path, hosts: tuple[str, ...] = ("gpu-a", "gpu-b")) -> RunHandle:
    nodes = [{"kind": "ssh", "host": h, "workdir": "/w"} for h in hosts]
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump({"volume": {"nodes": nodes}}))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"volume": {"gpus": False}}))
    return RunHandle("r-1", tmp_path, spec, tmp_path, node=nodes[0])


def test_a_resume_stops_the_earlier_attempts_ray_before_starting_anew(tmp_path: Path) -> None:
    handle = _handle(tmp_path)
    node = _Node()
    first = start_volume_cluster(nodes_through(node), handle, COPIES)
    kinds = [k for k, _ in node.ran]
    assert first is not None and kinds == ["proof"] * 2 + ["probe"] * 2 + ["start"] * 2
    record = (tmp_path / CLUSTER_FILE).read_text()
    assert first.cluster.token not in record and "gpu-b" in record
    node.ran.clear()
    second = start_volume_cluster(nodes_through(node), handle, COPIES)  # the resume
    assert second is not None and second.cluster.token != first.cluster.token
    assert node.ran[:2] == [("stop", "gpu-b"), ("stop", "gpu-a")]  # the head last
    assert json.loads(handle.spec_path.read_text())["volume"]["address"] == "gpu-a:6380"
    assert second.spec["volume"]["address"] == "gpu-a:6380"  # the head's spec, as a value


def test_an_earlier_ray_that_cannot_be_stopped_refuses_the_new_start(tmp_path: Path) -> None:
    handle = _handle(tmp_path)
    assert start_volume_cluster(nodes_through(_Node()), handle, COPIES) is not None
    stuck = _Node(stop_fails=True)
    with pytest.raises(DispatchError, match="earlier attempt could not be stopped: gpu-b:22: "
                                            "stopping Ray failed .*permission denied"):
        start_volume_cluster(nodes_through(stuck), handle, COPIES)
    assert "start" not in [k for k, _ in stuck.ran] and (tmp_path / CLUSTER_FILE).exists()


class _HeadGone(SSHDispatcher):
    """The real dispatcher's stop, its commands answered without SSH: the hosts in
    ``down`` are out of reach (as the follower found the head), the others stop."""

    def __init__(self, down: set[str]) -> None:
        super().__init__()
        self.down = down
        self.stopped: list[str] = []

    def run(self, node: SSHNode, command: str, stdin: str = "",
            timeout: float = 120) -> tuple[int, str, str]:
        if node.host in self.down:
            raise NodeUnreachable(f"{node.where}: connection timed out")
        assert command_kind(command) == "stop", command  # nothing but Ray's stop is sent
        self.stopped.append(node.host)
        return 0, "", ""


def test_a_head_out_of_reach_stops_every_other_node_and_keeps_its_record(
        tmp_path: Path) -> None:
    hosts = ("gpu-a", "gpu-b", "gpu-c")
    handle = _handle(tmp_path, hosts)
    assert start_volume_cluster(nodes_through(_Node()), handle, COPIES + COPIES[:1]) is not None
    dispatcher = _HeadGone({"gpu-a"})
    problems = dispatcher.clean_up(handle)
    assert dispatcher.stopped == ["gpu-c", "gpu-b"]  # every other node, the head last
    assert len(problems) == 1 and problems[0].startswith("gpu-a:22: connection timed out")
    assert (tmp_path / CLUSTER_FILE).exists()  # the head's Ray still to stop: kept
    dispatcher.down.clear()  # the next look reaches the head
    assert dispatcher.clean_up(handle) == []
    assert dispatcher.stopped[2:] == ["gpu-c", "gpu-b", "gpu-a"]
    assert not (tmp_path / CLUSTER_FILE).exists()


def test_an_unreadable_record_is_a_problem_named_not_a_crash(tmp_path: Path) -> None:
    handle = _handle(tmp_path)
    (tmp_path / CLUSTER_FILE).write_text("{not json")
    problems = _HeadGone(set()).clean_up(handle)
    assert len(problems) == 1 and CLUSTER_FILE in problems[0], problems


def _ports(tmp_path: Path) -> list[tuple[str, int, int]]:
    rows = json.loads((tmp_path / CLUSTER_FILE).read_text())["nodes"]
    return [(r["ray"]["address"], r["ray"]["ports"]["gcs"], r["ray"]["ports"]["min_worker"])
            for r in rows]


def test_two_nodes_on_one_host_get_ray_ports_apart_and_a_set_port_is_kept(
        tmp_path: Path) -> None:
    """Two volume nodes on one host collided on Ray's fixed ports (6382 taken, and Ray said
    "GCS has become overloaded"): the second is moved 100 up, recorded; a node's
    volume.nodes ray_port is its own; two set ports that overlap are refused (issue 37)."""
    handle = _handle(tmp_path, hosts=("gpu-a", "gpu-a"))
    assert start_volume_cluster(nodes_through(_Node()), handle, COPIES) is not None
    assert _ports(tmp_path) == [("gpu-a", 6380, 11000), ("gpu-a", 6480, 11100)]
    nodes = [{"kind": "ssh", "host": "gpu-a", "workdir": "/w"},
             {"kind": "ssh", "host": "gpu-a", "workdir": "/w2", "ray_port": 7000}]
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump({"volume": {"nodes": nodes}}))
    assert start_volume_cluster(nodes_through(_Node()), handle, COPIES) is not None
    assert _ports(tmp_path) == [("gpu-a", 6380, 11000), ("gpu-a", 7000, 11620)]
    nodes[0]["ray_port"] = 7050
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump({"volume": {"nodes": nodes}}))
    with pytest.raises(DispatchError, match="gpu-a:22: volume.nodes ray_port 7000 overlaps the "
                                            "Ray ports of gpu-a:22 on the same host gpu-a"):
        start_volume_cluster(nodes_through(_Node()), handle, COPIES)


def test_a_ray_port_in_use_is_named_before_ray_starts(tmp_path: Path) -> None:
    """The node's probe binds each of its Ray ports: one held by another process (here a
    listening socket on this host) is named with what it is for, before any ray start."""
    import socket
    import subprocess
    import sys

    from bot.dispatch.ray_cluster import RayNode, RayPorts, probe_command, start_cluster

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    try:
        ports = RayPorts().shifted(taken - RayPorts().object_manager)
        node = RayNode("root@gpu-a:22", "127.0.0.1", sys.executable, (), ports)
        ran: list[str] = []

        def shell(node: RayNode, command: str, stdin: str = "") -> tuple[int, str, str]:
            ran.append(command_kind(command))
            if command_kind(command) != "probe":
                return 0, "", ""
            done = subprocess.run(["sh", "-c", command], capture_output=True, text=True,
                                  timeout=60)
            out = json.loads(done.stdout)
            return done.returncode, json.dumps({**out, "ray": RAY_VERSION}), done.stderr

        with pytest.raises(DispatchError, match=f"root@gpu-a:22: port {taken} "
                                                r"\(object manager\).* already in use on "
                                                "127.0.0.1: another Ray, or another volume "
                                                "node on the same host; set this node's "
                                                "volume.nodes\\[\\].ray_port"):
            start_cluster(shell, [node])
        assert ran == ["probe"]  # refused before any ray start
        assert str(taken) in probe_command(sys.executable, [taken])
    finally:
        holder.close()


class _Dead(_HeadGone):
    """The runner is found dead on its node (the probe's answer, without SSH)."""

    async def _probe_files(self, node: SSHNode, pid: Any, run_dir: str) -> str | None:
        return "dead"


def test_is_alive_only_looks_and_release_stops_the_ray(tmp_path: Path) -> None:
    """Finding the runner dead stops nothing: the follower releases its Ray (issue 33)."""
    handle = _handle(tmp_path, ("gpu-a", "gpu-b"))
    assert start_volume_cluster(nodes_through(_Node()), handle, COPIES) is not None
    (tmp_path / "remote.json").write_text(json.dumps({"node": handle.node,
                                                      "run_dir": "/w/runs/r-1", "pid": 7}))
    dispatcher = _Dead(set())
    try:
        assert dispatcher.is_alive(handle) is False
        assert dispatcher.stopped == [] and (tmp_path / CLUSTER_FILE).exists()
        assert dispatcher.clean_up(handle) == []
        assert dispatcher.stopped == ["gpu-b", "gpu-a"]
        assert not (tmp_path / CLUSTER_FILE).exists()
    finally:
        dispatcher.close()  # the probe's event loop thread


def test_a_volume_node_without_its_workdir_is_refused_naming_the_field(tmp_path: Path) -> None:
    handle = _handle(tmp_path)
    nodes = [{"kind": "ssh", "host": "gpu-a", "workdir": "/w"}, {"kind": "ssh", "host": "gpu-b"}]
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump({"volume": {"nodes": nodes}}))
    fake = _Node()
    with pytest.raises(DispatchError, match="node.workdir: required for a node reached over "
                                            "the network"):
        start_volume_cluster(nodes_through(fake), handle, COPIES)
    assert fake.ran == []  # nothing was asked of any node
