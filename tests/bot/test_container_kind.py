"""A third node kind defined in the tests only (``tests/bot/container_kind.py``: one
module, one registry line): the manifest takes it, the service dispatches a pilot to it
through its fake ``exec`` program, and it is gone once unregistered."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.errors import DispatchError
from bot.manifest.load import load_manifest_file
from bot.manifest.nodes import NODE_MODELS, node_spec
from bot.messages.model import RecordingNotifier
from bot.nodes import registry
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from tests.bot.container_kind import ContainerNodeSpec, container_kind
from tests.bot.fakes import write_manifest
from tests.bot.manifest_helpers import dump, locs, make_project, merged


@pytest.fixture
def containers(tmp_path: Path) -> Iterator[Path]:
    root = tmp_path / "containers"
    (root / "box-1").mkdir(parents=True)
    with registry.registered(container_kind(root)):  # the one registry line
        yield root


def node_text(name: str = "box-1") -> str:
    return (f"node: {{kind: container, container: {name}, host: 127.0.0.1, workdir: work, "
            f"python: {sys.executable}}}")


def test_the_manifest_takes_a_registered_kind_and_forgets_it_after(tmp_path: Path) -> None:
    section = {"kind": "container", "container": "box-1"}
    assert node_spec(section) is None
    with registry.registered(container_kind(tmp_path)):
        typed = node_spec(section)
        assert isinstance(typed, ContainerNodeSpec) and typed.words == "container box-1"
        make_project(tmp_path)
        found = locs(tmp_path, dump(merged(node={**section, "contianer": "x"})))
        assert "node.contianer" in found
        found = locs(tmp_path, dump(merged(node={"kind": "vm"})))
        assert "'local' or 'ssh' or 'container'" in found["node.kind"].message
    assert "container" not in NODE_MODELS and "container" not in registry.KINDS
    assert node_spec(section) is None


def test_a_kind_name_is_registered_once(tmp_path: Path) -> None:
    with registry.registered(container_kind(tmp_path)), pytest.raises(ValueError):
        registry.register(container_kind(tmp_path / "other"))


def test_a_pilot_passes_on_a_container(tmp_path: Path, containers: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "home")})
    service = PilotService(settings, Store(settings.db_path),
                           registry.make_dispatchers(settings), RecordingNotifier())
    try:
        loaded = load_manifest_file(write_manifest(tmp_path / "project", extra=node_text()))
        run_id = service.submit(loaded, submitter="bob").run_id
        service.starter.start(run_id)
        run = service.follower.follow(run_id, timeout=180)
        assert run["status"] == "awaiting_decision", run.get("first_error")
        assert run["balance"]["total"] == 4 and run["balance"]["accepted"] == 4
        on_node = containers / "box-1" / "work" / "runs" / run_id
        assert (on_node / "events.jsonl").is_file() and (on_node / "exit_code").is_file()
        assert (Path(run["run_dir"]) / "balance.json").is_file()  # fetched back
    finally:
        service.close()


def test_a_pilots_evidence_copy_comes_home_verified_from_a_container(
        tmp_path: Path, containers: Path) -> None:
    """``results.copy_to`` on the bot host: the node's evidence copy is fetched through the
    container's ``Node`` into the home and verified there (the node-agnostic fetch)."""
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "home")})
    service = PilotService(settings, Store(settings.db_path),
                           registry.make_dispatchers(settings), RecordingNotifier())
    try:
        manifest = write_manifest(tmp_path / "project", extra=node_text(), copy_to=True)
        run_id = service.submit(load_manifest_file(manifest), submitter="bob").run_id
        service.starter.start(run_id)
        run = service.follower.follow(run_id, timeout=180)
        assert run["status"] == "awaiting_decision", run.get("first_error")
        home = tmp_path / "project" / "evidence" / run_id
        assert (home / "SHA256SUMS").is_file() and (home / "balance.json").is_file()
        report = json.loads((Path(run["run_dir"]) / "evidence-fetch.json").read_text())
        assert report["ok"] is True, report
        assert not [p for p in home.parent.iterdir() if p.name.startswith(".fetch")]
    finally:
        service.close()


def test_a_missing_container_fails_the_dispatch_naming_it(tmp_path: Path,
                                                          containers: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "home")})
    service = PilotService(settings, Store(settings.db_path),
                           registry.make_dispatchers(settings), RecordingNotifier())
    try:
        loaded = load_manifest_file(write_manifest(tmp_path / "project",
                                                   extra=node_text("box-9")))
        run_id = service.submit(loaded, submitter="bob").run_id
        with pytest.raises(DispatchError, match="box-9"):
            service.starter.start(run_id)
    finally:
        service.close()


def test_the_leases_ask_the_models_which_kinds_are_remote(tmp_path: Path) -> None:
    """The store's lease queries name no kind: a registered remote kind's runs are found on
    their host, and only while the kind is registered."""
    store = Store(tmp_path / "p.db")
    node = {"kind": "container", "container": "box-1", "host": "10.0.0.7"}
    store.create_run({"id": "c1", "name": "demo", "attempt": 1, "run_dir": "/tmp/c",
                      "status": "running", "node": node})
    assert store.running_on_node("10.0.0.7") == []
    with registry.registered(container_kind(tmp_path)):
        assert store.running_on_node("10.0.0.7") == ["c1"]
        assert [r.id for r in store.runs_on_node("10.0.0.7")] == ["c1"]
