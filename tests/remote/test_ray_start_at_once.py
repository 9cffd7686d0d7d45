"""``ray start`` on the worker nodes at the same time, the head first, and every node's
version probe at once (issue 23).

A recording shell stands in for the SSH connections: each worker node's ``ray start``
waits (with a deadline) until every worker node has begun its own, so one after another
never reaches them all at once.
"""

from __future__ import annotations

import json
import sys
import threading
import time

import pytest

from bot.dispatch.ray_cluster import RAY_START_AT_ONCE, RayNode, start_cluster
from bot.errors import DispatchError
from runner.raypin import RAY_VERSION
from tests.remote.remote_kit import command_kind

PROBE_OUT = json.dumps({"python": ".".join(map(str, sys.version_info[:3])), "ray": RAY_VERSION,
                        "cpus": 4})


class RecordingShell:
    """Answers the probe, records each node's ``ray start`` and stop; the workers' starts
    wait until ``together`` of them have been inside at once (or a deadline passes)."""

    def __init__(self, together: int, nodes: int, failing: str | None = None) -> None:
        self.together = together
        self.nodes = nodes
        self.probing = 0  # probes begun (none ends before all began, or the deadline)
        self.most_probing = 0
        self.failing = failing
        self.lock = threading.Condition()
        self.inside = 0
        self.most_inside = 0
        self.head_up = False
        self.released = False  # once ``together`` were inside, none waits any more
        self.started_before_head: list[str] = []
        self.stopped: list[str] = []

    def __call__(self, node: RayNode, command: str, stdin: str = "") -> tuple[int, str, str]:
        kind = command_kind(command)
        if kind != "start":
            if kind == "stop":
                with self.lock:
                    self.stopped.append(node.where)
                return 0, "", ""
            with self.lock:  # the version probe: held until every node's has begun
                self.probing += 1
                self.most_probing = max(self.most_probing, self.probing)
                self.lock.notify_all()
                deadline = time.monotonic() + 5
                while self.probing < self.nodes and time.monotonic() < deadline:
                    self.lock.wait(deadline - time.monotonic())
            return 0, PROBE_OUT + "\n", ""
        if "--head" in command:
            with self.lock:
                self.head_up = True
            return 0, "", ""
        with self.lock:
            if not self.head_up:
                self.started_before_head.append(node.where)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
            self.released = self.released or self.inside >= self.together
            self.lock.notify_all()
            deadline = time.monotonic() + 5
            while not self.released and time.monotonic() < deadline:
                self.lock.wait(deadline - time.monotonic())
        with self.lock:
            self.inside -= 1
        if node.where == self.failing:
            return 1, "", "raylet did not come up\n"
        return 0, "", ""


def _nodes(count: int) -> list[RayNode]:
    return [RayNode(f"n{i}", f"10.0.0.{i + 1}", temp_dir=f"/tmp/pf-{i}") for i in range(count)]


def test_the_worker_nodes_start_ray_at_the_same_time_after_the_head() -> None:
    shell = RecordingShell(together=3, nodes=4)
    heard: list[tuple[int, str]] = []
    cluster = start_cluster(shell, _nodes(4), lambda i, node: heard.append((i, node.where)))
    assert cluster.address == "10.0.0.1:6380"
    assert shell.most_probing == 4  # every node's version probe at once
    assert shell.most_inside == 3  # the three workers' starts overlapped
    assert shell.started_before_head == []  # the head was up before any worker started
    assert heard[0] == (0, "n0")  # each node's ray_up is still heard, the head first
    assert sorted(heard) == [(0, "n0"), (1, "n1"), (2, "n2"), (3, "n3")]


def test_no_more_than_the_bound_start_at_once() -> None:
    count = RAY_START_AT_ONCE + 3  # workers beyond the bound wait for a free slot
    shell = RecordingShell(together=RAY_START_AT_ONCE, nodes=RAY_START_AT_ONCE)
    heard: list[int] = []
    start_cluster(shell, _nodes(count), lambda i, node: heard.append(i))
    assert shell.most_inside == RAY_START_AT_ONCE
    assert sorted(heard) == list(range(count))


def test_a_failing_worker_node_is_named_and_every_node_is_stopped() -> None:
    shell = RecordingShell(together=3, nodes=4, failing="n2")
    with pytest.raises(DispatchError, match=r"^n2: ray start failed \(exit 1\): raylet did not "
                                            r"come up"):
        start_cluster(shell, _nodes(4))
    assert sorted(shell.stopped) == ["n0", "n1", "n2", "n3"]
    assert shell.stopped[-1] == "n0"  # the head last
