"""Ten volume nodes are prepared a few at a time, not one after another, each reported.

The SSH dispatcher's own ``_prepare_all`` runs for real on its event loop; only the copy
of one node (``_prepare``: the SSH upload, tested end to end in test_volume_service.py) is
replaced by a fake that counts how many copies are under way at once. No sshd here.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from bot.nodes.ssh.dispatcher import PREPARE_AT_ONCE, SSHDispatcher


@dataclass(frozen=True)
class FakePlan:
    remote_run_dir: str
    remote_pkg_root: str
    remote_project: str


class CountingCopies(SSHDispatcher):
    """Each node's copy takes a few turns of the event loop; ``fail`` nodes refuse."""

    def __init__(self, fail: frozenset[int] = frozenset()) -> None:
        super().__init__(known_hosts=None, use_agent=False)
        self.fail = fail
        self.now = self.peak = 0

    async def _prepare(self, handle: RunHandle, node: SSHNode, hold: bool,
                       index: int = 0) -> tuple[Any, Any, dict[str, int]]:
        self.now += 1
        self.peak = max(self.peak, self.now)
        for _ in range(3):
            await asyncio.sleep(0)
        self.now -= 1
        index = int(node.host.split("-")[1])
        if index in self.fail:
            raise DispatchError(f"volume.nodes[{index}]: the workdir is locked by run x")
        root = f"/srv/{node.host}"
        return (FakePlan(f"{root}/runs/r", f"{root}/runner-pkg", f"{root}/p"),
                f"launcher-{index}" if hold else None, {"project": 1000, "run": 10})


def nodes(count: int) -> list[SSHNode]:
    return [SSHNode.from_dict({"kind": "ssh", "host": f"gpu-{i}", "workdir": "/srv"})
            for i in range(count)]


def handle(tmp_path: Path, steps: list[dict[str, Any]]) -> RunHandle:
    return RunHandle("r", tmp_path, tmp_path / "spec.json", tmp_path, progress=steps.append)


def test_ten_nodes_are_copied_four_at_a_time_each_reported(tmp_path: Path) -> None:
    dispatcher = CountingCopies()
    steps: list[dict[str, Any]] = []
    held: list[tuple[SSHNode, Any]] = []
    try:
        copies = dispatcher._call(dispatcher._prepare_all(handle(tmp_path, steps), nodes(10),
                                                          held), 30)
    finally:
        dispatcher.close()
    assert dispatcher.peak == PREPARE_AT_ONCE == 4  # several at once, never more
    assert [c.run_dir for c in copies] == [f"/srv/gpu-{i}/runs/r" for i in range(10)]
    assert sorted(s["index"] for s in steps) == list(range(10))
    assert {(s["phase"], s["bytes"]) for s in steps} == {("uploaded", 1010)}
    assert [launcher for _, launcher in held] == [f"launcher-{i}" for i in range(1, 10)]


def test_a_node_that_fails_its_copy_is_named_after_the_others_are_done(
        tmp_path: Path) -> None:
    dispatcher = CountingCopies(fail=frozenset({2, 7}))
    steps: list[dict[str, Any]] = []
    held: list[tuple[SSHNode, Any]] = []
    try:
        with pytest.raises(DispatchError, match=r"volume.nodes\[2\]: the workdir is locked"):
            dispatcher._call(dispatcher._prepare_all(handle(tmp_path, steps), nodes(10),
                                                     held), 30)
    finally:
        dispatcher.close()
    # Every other node's copy was made and its lock holder kept, for the caller to let go.
    assert sorted(s["index"] for s in steps) == [0, 1, 3, 4, 5, 6, 8, 9]
    assert [launcher for _, launcher in held] == [f"launcher-{i}" for i in (1, 3, 4, 5, 6,
                                                                           8, 9)]
