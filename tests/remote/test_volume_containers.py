"""A two-node volume on the tests' ``container`` kind (``tests/bot/container_kind.py``):
its pilot on the first container, then, approved, the volume over both, each running a
Ray node from its own copy of the run, dispatched by the node-agnostic dispatcher through
the fake ``exec`` program. Starts Ray: run it under ``flock /tmp/preflight-ray.lock``."""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.nodes import registry
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.container_kind import container_kind
from tests.processes import wait_until
from tests.remote.volume_service_kit import TwoNodesOneHost, stop_everything, write_project

COUNT = 40


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[TwoNodesOneHost]:
    boxes = tmp_path / "containers"
    nodes = TwoNodesOneHost([boxes / "box-1" / "work", boxes / "box-2" / "work"])
    for workdir in nodes.workdirs:
        workdir.parent.mkdir(parents=True)
    yield nodes
    for temp in nodes.temps:
        shutil.rmtree(temp, ignore_errors=True)


def test_a_two_node_volume_passes_on_containers(tmp_path: Path,
                                                layout: TwoNodesOneHost) -> None:
    # each container's workdir named in full (the test reads each container's copy there)
    nodes = [{"kind": "container", "container": w.parent.name, "host": "127.0.0.1",
              "workdir": str(w), "python": sys.executable} for w in layout.workdirs]
    manifest, ids = write_project(tmp_path / "project", nodes, COUNT)
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "home")})
    with registry.registered(container_kind(tmp_path / "containers", layout)):
        service = PilotService(settings, Store(settings.db_path),
                               registry.make_dispatchers(settings), RecordingNotifier())
        try:
            pilot = service.submit(load_manifest_file(manifest), submitter="bob").run_id
            service.starter.start(pilot)
            run = service.follower.follow(pilot, timeout=180)
            assert (run["status"], run["outcome"]) == ("awaiting_decision", "passed"), (
                run["first_error"], run["verdict"])
            volume = service.decider.decide(pilot, "approve", "pilot clean", "alice")["volume_run"]
            run = service.follower.follow(volume, timeout=300)
        finally:
            stop_everything(service, layout.groups)
    assert (run["kind"], run["status"], run["outcome"]) == ("volume", "finished", "passed"), (
        run["first_error"], run["verdict"])
    assert run["balance"]["total"] == COUNT and run["balance"]["accepted"] == COUNT
    assert Counter(i["id"] for i in service.store.items(volume)) == Counter(ids)
    workers = [e for e in service.store.events(volume) if e.type == "volume.workers"]
    placed = workers[-1].data["workers"]
    assert {w["run_dir"] for w in placed} == {f"{w}/runs/{volume}" for w in layout.workdirs}
    for workdir in layout.workdirs:  # each container had its own copy and its card proof
        assert (workdir / "runs" / volume / "spec.json").is_file()
    # the second container's workdir was locked again while its Ray lived: the launcher's
    # hold ran from its copy (its exit status there once Ray stopped), then let it go
    second = layout.workdirs[1]
    wait_until(lambda: (second / "runs" / volume / "exit_code").is_file(), "the hold's end", 30)
    wait_until(lambda: not (second / "dispatch.lock").exists(), "box-2 let go", 30)
    assert not (tmp_path / "home" / "runs" / volume / "ray_cluster.json").exists()  # stopped
