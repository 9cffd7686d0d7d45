"""A several-node volume dispatched by the SSH dispatcher (a real loopback sshd): the
dispatcher starts Ray on both nodes, the driver on the head joins that cluster with the
token it got through the launcher's standard input, and when the run ends Ray is stopped
on every node (the process table is read). Two Ray nodes on one host: shifted ports and
their own temp dirs, as in ``test_ray_cluster.py``."""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import yaml

from bot.dispatch.base import RunHandle
from bot.dispatch.ray_cluster import RayNode
from bot.dispatch.ssh import SSHDispatcher
from bot.dispatch.upload import RUNNER_PACKAGE, SSHNode
from bot.dispatch.volume_cluster import CLUSTER_FILE
from tests.processes import wait_until
from tests.remote.conftest import Sshd
from tests.remote.test_ray_cluster import _free_layout, _ray_pids
from tests.volume.kit import events, make_volume, set_params


class _Recording(SSHDispatcher):
    """Keeps what each remote command was given, to show where the token went."""

    sent: list[tuple[str, str]]

    def run(self, node: SSHNode, command: str, stdin: str = "",
            timeout: float = 120) -> tuple[int, str, str]:
        self.sent.append((command, stdin))
        return super().run(node, command, stdin, timeout)


def _setup(sshd: Sshd, tmp_path: Path, temps: list[str]) -> tuple[
        RunHandle, _Recording, list[str], str]:
    """A 36-item volume over two nodes (one fake card each) and a recording dispatcher."""
    ports = _free_layout()

    def ray_node(i: int, node: SSHNode, run_id: str, gpus: bool) -> RayNode:
        assert gpus  # the spec's; one fake card per node puts one worker on each
        return RayNode(node.where, node.host, node.python, (0,), ports.shifted(100 * i),
                       temps[i])

    spec_path, ids = make_volume(tmp_path, 36, gpus=True, batch_size=6)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    workdir = tmp_path / "node"
    node = sshd.node(workdir, python=sys.executable)
    (run_dir / "manifest.yaml").write_text(yaml.safe_dump(
        {"node": node, "volume": {"nodes": [node, {**node, "workdir": str(workdir) + "2"}]}}))
    handle = RunHandle("r-vol", run_dir, spec_path, tmp_path / "project", node=node)
    dispatcher = sshd.dispatcher(_Recording, runner_package=RUNNER_PACKAGE, ray_node=ray_node)
    dispatcher.sent = []
    return handle, dispatcher, ids, f"127.0.0.1:{ports.gcs}"


def _groups(temps: list[str]) -> list[int]:
    return [int(Path(t, "preflight.pgid").read_text()) for t in temps]


def _nothing_left(temps: list[str], groups: list[int]) -> None:
    wait_until(lambda: not _ray_pids(temps, groups), "no Ray process left on the nodes", 60)
    assert len(groups) == 2


def test_a_two_node_volume_runs_on_the_cluster_the_dispatcher_starts_and_stops(
        sshd: Sshd, tmp_path: Path) -> None:
    temps = [tempfile.mkdtemp(prefix="rv", dir="/tmp") for _ in range(2)]
    handle, dispatcher, ids, address = _setup(sshd, tmp_path, temps)
    run_dir, workdir = handle.run_dir, tmp_path / "node"
    groups: list[int] = []
    try:
        dispatcher.start(handle)
        groups = _groups(temps)
        wait_until(lambda: dispatcher.exit_code(handle) is not None, "the driver ended", 120)
        remote_run = workdir / "runs" / "r-vol"
        assert dispatcher.exit_code(handle) == 0, (remote_run / "runner.log").read_text()[-3000:]
        assert (run_dir / CLUSTER_FILE).exists()
        dispatcher.fetch_results(handle)  # the run has ended: Ray is stopped on every node
        assert not (run_dir / CLUSTER_FILE).exists()
    finally:
        dispatcher.stop(handle)  # also stops the cluster if the test failed before the end
        dispatcher.close()
    _nothing_left(temps, groups)
    # the driver joined the cluster at the head's address, with a worker on each node
    workers = [e for e in events(run_dir) if e.type == "volume.workers"][0].data["workers"]
    assert len({w["node"] for w in workers}) == 2
    assert json.loads(handle.spec_path.read_text())["volume"]["address"] == address
    balance = json.loads((run_dir / "balance.json").read_text())
    assert balance["ok"] and balance["total"] == len(ids), balance["problems"][:5]
    rows = (run_dir / "balance.csv").read_text().splitlines()[1:]
    assert Counter(r.split(",")[0] for r in rows) == Counter(ids)  # every id exactly once
    # the token went on standard input only: on no command line, in no file of the run
    tokens = {stdin.strip() for _, stdin in dispatcher.sent if stdin}
    assert len(tokens) == 1 and len(token := tokens.pop()) == 64
    assert not [c for c, _ in dispatcher.sent if token in c]
    for root in (run_dir, workdir, *map(Path, temps)):
        for path in root.rglob("*") if root.exists() else ():
            assert not path.is_file() or token.encode() not in path.read_bytes(), path
    for temp in temps:
        shutil.rmtree(temp, ignore_errors=True)


def test_stopping_a_two_node_volume_mid_run_ends_the_driver_and_ray_on_every_node(
        sshd: Sshd, tmp_path: Path) -> None:
    temps = [tempfile.mkdtemp(prefix="rw", dir="/tmp") for _ in range(2)]
    handle, dispatcher, _ids, _address = _setup(sshd, tmp_path, temps)
    set_params(handle.spec_path, delay_s=0.5)  # long enough to be stopped mid-run
    groups: list[int] = []
    try:
        dispatcher.start(handle)
        groups = _groups(temps)
        wait_until(lambda: any(e.type == "progress" for e in
                               dispatcher.read_events(handle, 0)[0]), "the volume started", 120)
        dispatcher.stop(handle)  # preflight stop RUN
        assert not (handle.run_dir / CLUSTER_FILE).exists()
        wait_until(lambda: not dispatcher.is_alive(handle), "the driver ended", 60)
    finally:
        dispatcher.stop(handle)
        dispatcher.close()
    _nothing_left(temps, groups)
    for temp in temps:
        shutil.rmtree(temp, ignore_errors=True)
