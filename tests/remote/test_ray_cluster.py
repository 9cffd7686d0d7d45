"""The volume's Ray cluster over SSH (a real loopback sshd): versions are compared before
anything starts. The port layout and process helpers serve the tests that run two Ray nodes
on one host (distinct ports, the second node's the first's shifted, and temp dirs of their
own); a cluster started, used and stopped over SSH end to end is
``test_volume_service.py``'s."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bot.dispatch.ray_cluster import (
    RayNode,
    check_versions,
    start_cluster,
)
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from runner.raypin import RAY_VERSION
from tests.processes import live_processes
from tests.remote.conftest import BARE_PYTHON, Sshd
from tests.remote.remote_kit import command_kind


def _shell(sshd: Sshd, workdir: Path):  # type: ignore[no-untyped-def]
    dispatcher = sshd.dispatcher()
    ssh = SSHNode(host="127.0.0.1", workdir=str(workdir), port=sshd.port, user=sshd.user)

    def shell(node: RayNode, command: str, stdin: str = "") -> tuple[int, str, str]:
        return dispatcher.run(ssh, command, stdin, timeout=180)

    return dispatcher, shell


def _ray_pids(temp_dirs: list[str], groups: list[int]) -> list[int]:
    """Live processes whose command line names one of the run's Ray temp dirs, or that
    belong to the process group a node's ``ray start`` ran in (Ray's agents rename
    themselves ``ray::...``)."""
    return [p.pid for p in live_processes()
            if any(d.encode() in p.cmdline for d in temp_dirs) or p.pgid in groups]


def test_a_node_without_ray_or_with_another_version_is_refused_before_anything_starts(
        sshd: Sshd, tmp_path: Path) -> None:
    dispatcher, ssh_shell = _shell(sshd, tmp_path)
    ran: list[str] = []

    def shell(node: RayNode, command: str, stdin: str = "") -> tuple[int, str, str]:
        ran.append(command)
        return ssh_shell(node, command, stdin)

    try:
        bare = [RayNode("head", "127.0.0.1", sys.executable), RayNode("n2", "127.0.0.1",
                                                                       BARE_PYTHON)]
        with pytest.raises(DispatchError, match=f"n2: Ray is not installed for {BARE_PYTHON}"
                                                f".*pip install 'ray=={RAY_VERSION}'"):
            start_cluster(shell, bare)
        older = tmp_path / "older-python"
        older.write_text('#!/bin/sh\necho \'{"python": "3.11.2", "ray": "2.59.0"}\'\n')
        older.chmod(0o755)
        mixed = [bare[0], RayNode("n3", "127.0.0.1", str(older))]
        with pytest.raises(DispatchError, match=f"n3: Ray 2.59.0, but the head head has Ray "
                                                f"{RAY_VERSION}"):
            start_cluster(shell, mixed)
    finally:
        dispatcher.close()
    assert ran and not [c for c in ran if command_kind(c) == "start"]  # refused before any


def _probe(python: str) -> str:
    return json.dumps({"python": python, "ray": RAY_VERSION})


def test_python_minor_mismatch_is_named_with_both_versions() -> None:
    nodes = [RayNode("a", "h1"), RayNode("b", "h2")]
    with pytest.raises(DispatchError, match=r"b: Python 3.10.4, but the head a has Python "
                                            r"3.11.9"):
        check_versions(nodes, [_probe("3.11.9"),
                               _probe("3.10.4")])
    check_versions(nodes, [_probe("3.11.9"),
                           _probe("3.11.2")])
