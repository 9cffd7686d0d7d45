"""`preflight stop` of a two-node volume while another bot process follows it (issue 37,
point 3): one process stops Ray and fetches the results, the other waits for it; neither
fails, and the local run directory gets the node's ledger and events. Two loopback sshd
nodes, a Ray cluster on both, each "process" a service of its own over one database."""

from __future__ import annotations

import shutil
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.upload import SSHNode
from bot.dispatch.volume_cluster import CLUSTER_FILE
from bot.manifest.load import load_manifest_file
from tests.processes import wait_until
from tests.remote.remote_kit import provision
from tests.remote.sshd_server import Sshd
from tests.remote.test_volume_service import _ledger
from tests.remote.volume_service_kit import (
    TwoNodesOneHost,
    compose,
    dispatcher_for,
    stop_everything,
    write_project,
)


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[TwoNodesOneHost]:
    nodes = TwoNodesOneHost([tmp_path / "node0", tmp_path / "other" / "node1"])
    yield nodes
    for temp in nodes.temps:
        shutil.rmtree(temp, ignore_errors=True)


def test_a_stop_while_another_process_follows_ends_the_volume_once(
        sshd: Sshd, sshd2: Sshd, tmp_path: Path, layout: TwoNodesOneHost) -> None:
    project = tmp_path / "project"
    nodes = [s.node(w, python=sys.executable) for s, w in zip((sshd, sshd2), layout.workdirs)]
    manifest, _ids = write_project(project, nodes, 400)
    service = compose(tmp_path / "home", dispatcher_for([sshd, sshd2], layout,
                                                        tmp_path / "known_hosts"))
    other = compose(tmp_path / "home", dispatcher_for([sshd, sshd2], layout,
                                                      tmp_path / "known_hosts2"))
    followed: dict[str, Any] = {}
    volume = ""
    try:
        for s in (sshd, sshd2):
            provision(service.store, s.lease_key)
        pilot = service.submit(load_manifest_file(manifest), submitter="bob").run_id
        service.starter.start(pilot)
        assert service.follower.follow(pilot, timeout=180)["outcome"] == "passed"
        (project / "slow").touch()
        volume = service.decider.decide(pilot, "approve", "pilot clean", "alice")["volume_run"]
        wait_until(lambda: len(_ledger(service, volume)) >= 16, "a few batches recorded", 240)

        def follow() -> None:  # `preflight follow VOLUME` in another terminal
            try:
                followed["run"] = other.follower.follow(volume, timeout=180)
            except Exception as exc:  # noqa: BLE001 - told by the assertion below
                followed["run"] = exc

        watcher = threading.Thread(target=follow)
        watcher.start()
        stopped = service.stop(volume, by="alice", reason="stop it mid-run", timeout=180)
        watcher.join(timeout=240)
    finally:
        stop_everything(service, layout.groups)
        other.close()
        other.store.close()
    assert isinstance(followed["run"], dict), followed["run"]
    for run in (stopped, followed["run"]):
        assert (run["status"], run["stop"]["by"]) == ("stopped", "alice")
    evidence = stopped.get("evidence") or {}
    assert "fetch_error" not in evidence, evidence
    run_dir = Path(stopped["run_dir"])
    for name in ("ledger.sqlite", "events.jsonl", "environment.json"):
        assert (run_dir / name).is_file(), name  # fetched from the head, once
    assert not (run_dir / CLUSTER_FILE).exists()  # Ray stopped on every node
    assert not [t for t in layout.temps if Path(t).exists()]  # and its temp dirs removed
    # both nodes are this host (one hostname): the workers name theirs by its address
    workers = service.store.events_of_type(volume, "volume.workers")[-1].data["workers"]
    wheres = {SSHNode.from_dict(n).where for n in nodes}
    assert {w["where"] for w in workers} == wheres and len({w["node"] for w in workers}) == 2
    assert all(w["worker"].split("@", 1)[1].startswith(w["where"]) for w in workers)
