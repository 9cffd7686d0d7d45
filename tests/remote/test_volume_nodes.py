"""A node of a several-node volume whose card proof fails refuses the dispatch before any
Ray starts (a real loopback sshd, two nodes whose workdirs differ). That every node runs
its workers from its own copy of the run (read from the raylet's command line, not from
our records), proves its cards there and keeps its workdir locked while its Ray lives is
checked end to end, through the service, in ``test_volume_service.py``.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from bot.dispatch.base import RunHandle
from bot.dispatch.ray_cluster import RayNode
from bot.dispatch.upload import RUNNER_PACKAGE, SSHNode
from bot.dispatch.volume_cluster import CLUSTER_FILE
from bot.errors import DispatchError
from bot.nodes.ssh.dispatcher import SSHDispatcher
from tests.remote.conftest import BARE_PYTHON, Sshd
from tests.remote.remote_kit import free_port_layout
from tests.remote.test_ray_cluster import _ray_pids
from tests.volume.kit import make_volume

# Reports, for every item, the file it read, the module and runner package it ran from,
# and its raylet's command line (which names the node's Ray temp dir).
NODEWORK = '''
import os
import runner


def handle(items, ctx):
    with open("/proc/%d/cmdline" % os.getppid(), "rb") as fh:
        raylet = fh.read().replace(b"\\0", b" ").decode()
    out = []
    for it in items:
        with open(it.path, encoding="utf-8") as fh:
            text = fh.read()
        out.append({"id": it.id, "status": "accepted", "category": "even",
                    "output": {"path": it.path, "text": text, "module": __file__,
                               "runner": runner.__file__, "raylet": raylet}})
    return out
'''


@pytest.fixture
def temps() -> Iterator[list[str]]:
    dirs = [tempfile.mkdtemp(prefix="vn", dir="/tmp") for _ in range(2)]
    yield dirs
    for d in dirs:
        shutil.rmtree(d, ignore_errors=True)


def _setup(sshd: Sshd, tmp_path: Path, temps: list[str], *, count: int, gpus: bool,
           pythons: tuple[str, str]) -> tuple[RunHandle, SSHDispatcher, list[Path]]:
    """A volume over two nodes of the loopback sshd whose workdirs differ."""
    ports = free_port_layout()

    def ray_node(i: int, node: SSHNode, run_id: str, gpus: bool) -> RayNode:
        cards = (0,) if gpus else None  # Ray's fake GPU resources: one worker per node
        return RayNode(node.where, node.host, node.python, cards, ports.shifted(100 * i),
                       temps[i])

    spec_path, _ids = make_volume(tmp_path, count, gpus=gpus, batch_size=3)
    spec = json.loads(spec_path.read_text())
    spec["task"].update(handler="nodework:handle", categories=["even"])
    spec["inputs"]["expected_refusals"] = []
    spec_path.write_text(json.dumps(spec))
    (tmp_path / "project" / "nodework.py").write_text(NODEWORK)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    workdirs = [tmp_path / "head-node", tmp_path / "other" / "second-node"]
    nodes = [sshd.node(w, python=p) for w, p in zip(workdirs, pythons)]
    (run_dir / "manifest.yaml").write_text(yaml.safe_dump({"node": nodes[0],
                                                          "volume": {"nodes": nodes}}))
    handle = RunHandle("r-vol", run_dir, spec_path, tmp_path / "project", node=nodes[0])
    dispatcher = sshd.dispatcher(runner_package=RUNNER_PACKAGE, ray_node=ray_node)
    return handle, dispatcher, workdirs


def test_a_node_whose_python_lacks_torch_is_refused_before_any_ray_starts(
        sshd: Sshd, tmp_path: Path, temps: list[str]) -> None:
    handle, dispatcher, workdirs = _setup(sshd, tmp_path, temps, count=6, gpus=False,
                                          pythons=(sys.executable, BARE_PYTHON))
    try:
        with pytest.raises(DispatchError, match=(
                rf"volume.nodes\[1\] \(\S+@127.0.0.1:{sshd.port}, python {BARE_PYTHON}\): "
                r"the card proof failed at the torch stage: \w+: .*torch.*nothing was "
                r"started")):
            dispatcher.start(handle)
    finally:
        dispatcher.close()
    assert not _ray_pids(temps, [])  # no Ray started on any node
    assert not any(Path(t, "preflight.pgid").exists() for t in temps)
    assert not (handle.run_dir / CLUSTER_FILE).exists()
    assert not (workdirs[0] / "runs" / "r-vol" / "runner.pid").exists()  # no driver either
    assert not [w for w in workdirs if (w / "dispatch.lock").exists()]  # both let go
    # node 2 got its own copy (its proof ran from it); node 1's proof passed
    assert (workdirs[1] / "runner-pkg" / "runner" / "__main__.py").exists()
    head = (workdirs[0] / "runs" / "r-vol" / "card-proof" / "events.jsonl").read_text()
    assert '"stage": "compute"' in head
