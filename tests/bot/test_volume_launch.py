"""The volume run goes to its first listed node, with the engine settings in its spec."""

from __future__ import annotations

import json
from pathlib import Path

from tests.bot.fakes import pilot_script
from tests.bot.test_service import IDS, make, submit

VOLUME = ('volume: {inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 4}, '
          'cards_per_worker: 1, batch_size: 3, nodes: [{kind: local}]}')


def test_the_volume_run_carries_its_engine_settings_and_first_node(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    pilot = submit(service, tmp_path, extra=VOLUME)
    service.follower.follow(pilot, timeout=30)
    volume = service.decider.decide(pilot, "approve", "pilot clean", "alice")["volume_run"]
    run = service.store.get_run(volume)
    assert run["node"]["kind"] == "local"
    spec = json.loads(Path(run["spec_path"]).read_text())
    assert spec["volume"]["batch_size"] == 3 and spec["volume"]["cards_per_worker"] == 1
    assert spec["volume"]["address"] is None  # the driver starts its own Ray on the node
    assert spec["volume"]["prefetch"] == 1  # read ahead on by default (issue 34)
    pilot_spec = json.loads(Path(service.store.get_run(pilot)["spec_path"]).read_text())
    assert pilot_spec["volume"] is None  # a pilot runs in-process


def test_the_volume_s_node_is_the_first_listed_else_the_pilot_s(tmp_path: Path) -> None:
    from bot.pilot.volume_nodes import volume_node
    from tests.bot.manifest_helpers import dump, load, make_project, merged

    make_project(tmp_path)
    inputs = {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12}
    listed = load(tmp_path, dump(merged(hardware={"lots": 2}, volume={"inputs": inputs, "nodes": [
        {"kind": "ssh", "host": "gpu-b.example", "workdir": "/w"},
        {"kind": "ssh", "host": "gpu-c.example", "workdir": "/w"}]})))
    assert volume_node(listed.manifest).host == "gpu-b.example"
    warning = {w.loc: w for w in listed.warnings}["volume.nodes"].message
    assert "Ray is started on each" in warning and "only its healthy cards" in warning
    default = load(tmp_path, dump(merged(volume={"inputs": inputs})))
    assert volume_node(default.manifest) == default.manifest.node
