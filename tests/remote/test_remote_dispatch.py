"""The SSH dispatcher against a real sshd: upload, detached start, follow, fetch back."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import locate, node_section
from bot.errors import DispatchError, LeaseError
from tests.events_check import kept
from tests.remote.remote_kit import (
    Bot,
    make_bot,
    provisioned_bot,
    start_run,
    submit,
    write_project,
)
from tests.remote.sshd_server import BARE_PYTHON, Sshd


def test_fake_runner_dispatched_end_to_end_with_the_node_python(tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["status"] == "awaiting_decision", run
        assert run["outcome"] == "passed", run["verdict"]
        prepare = {s["stage"]: s for s in bot.store.stages(run_id)}["prepare"]["facts"]
        # the node's own interpreter ran it, on the node's copy of the inputs
        assert prepare["python"] == BARE_PYTHON
        assert prepare["inputs_dir"].startswith(str(workdir)) and prepare["count"] == 4
        remote_run = workdir / "runs" / run_id
        local_run = Path(run["run_dir"])
        # the local mirror is byte-identical; results came back; local spec kept local paths
        mirrored = (local_run / "events.jsonl").read_bytes()
        assert mirrored == (remote_run / "events.jsonl").read_bytes()
        assert (local_run / "exit_code").read_text().strip() == "0"
        assert json.loads((local_run / "spec.json").read_text())["inputs"]["dir"] == str(
            (tmp_path / "project" / "data" / "pilote").resolve())
        assert [i["id"] for i in bot.store.items(run_id)] == [f"doc-0{n}" for n in range(1, 5)]
        _restarted_bot_finds_the_run_without_the_node_section(bot, run, remote_run)


def _restarted_bot_finds_the_run_without_the_node_section(bot: Bot, run: dict[str, Any],
                                                           remote_run: Path) -> None:
    """A handle without ``node`` (a restarted bot): remote.json and manifest.yaml say where."""
    bot.dispatcher.close()  # closed, then used again: a fresh loop and connection
    handle = RunHandle(run["id"], Path(run["run_dir"]), Path(run["spec_path"]),
                       Path(run["run_dir"]), node=None)
    assert node_section(handle)["port"] == run["node"]["port"]  # from manifest.yaml
    node, layout = locate(handle)  # from remote.json
    assert (node.host, node.port, layout["run_dir"]) == ("127.0.0.1", run["node"]["port"],
                                                         str(remote_run))
    events, offset = bot.dispatcher.read_events(handle, 0)
    assert [e.seq for e in kept(events)] == [e.seq for e in bot.store.events(run["id"])]
    assert offset == (remote_run / "events.jsonl").stat().st_size == run["events_offset"]
    assert bot.dispatcher.exit_code(handle) == 0 and not bot.dispatcher.is_alive(handle)
    # the node lost the run directory: a clear error, not a traceback
    shutil.rmtree(remote_run)
    with pytest.raises(DispatchError, match="missing on the node"):
        bot.dispatcher.fetch_results(handle)
    # a remote.json that a dispatch did not write names what it lacks
    layout_file = Path(run["run_dir"]) / "remote.json"
    layout_file.write_text(json.dumps({"run_dir": str(remote_run)}))
    with pytest.raises(DispatchError, match="remote.json lacks node;"):
        locate(handle)
    layout_file.write_text("[1, 2")
    with pytest.raises(DispatchError, match="missing or unreadable"):
        bot.dispatcher.read_events(handle, 0)
    (Path(run["run_dir"]) / "manifest.yaml").write_text("node: {kind: local}\n")
    with pytest.raises(DispatchError, match="node.kind .local. is not a node reached over"):
        node_section(handle)


def test_a_node_python_that_prints_no_hashes_fails_the_dispatch_clearly(tmp_path: Path,
                                                                        sshd: Sshd) -> None:
    manifest = write_project(tmp_path / "project", {**sshd.node(tmp_path / "node"),
                                                    "python": "echo"})
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = submit(bot, manifest)
        with pytest.raises(DispatchError, match="node.python .echo. did not answer the launcher"):
            bot.service.starter.start(run_id)
        assert bot.store.get_run(run_id)["status"] == "dispatch_failed"


def test_second_dispatch_uploads_only_the_run_files(tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    project = tmp_path / "project"
    manifest = write_project(project, sshd.node(workdir))
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        first = start_run(bot, manifest)
        bot.service.follower.follow(first, timeout=60)
        assert bot.dispatcher.uploaded[first]["project"] > 0
        assert bot.dispatcher.uploaded[first]["runner"] > 0
        second = start_run(bot, manifest)
        bot.service.follower.follow(second, timeout=60)
        sent = bot.dispatcher.uploaded[second]
        assert sent["project"] == 0 and sent["runner"] == 0 and sent["run"] > 0
        # a changed input is uploaded again, a removed one disappears from the node
        (project / "data" / "pilote" / "doc-01.txt").write_text("contract changed")
        (project / "src" / "app.py").unlink()
        # what is never sent is never removed from the node: a venv built there, runs/
        remote_project = next((workdir / "projects").iterdir())
        venv = remote_project / "env"
        (venv / "lib").mkdir(parents=True)
        (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")
        (venv / "lib" / "torch.so").write_text("big")
        (remote_project / "runs").mkdir()
        (remote_project / "runs" / "keep.txt").write_text("node output")
        third = start_run(bot, manifest)
        bot.service.follower.follow(third, timeout=60)
        assert bot.dispatcher.uploaded[third]["project"] == len("contract changed")
        assert not (remote_project / "src" / "app.py").exists()
        assert (venv / "lib" / "torch.so").exists()
        assert (remote_project / "runs" / "keep.txt").exists()
        assert (remote_project / "data" / "pilote" / "doc-01.txt").read_text() == "contract changed"


def test_changed_host_key_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    other = tmp_path / "other_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = (tmp_path / "other_key.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    manifest = write_project(tmp_path / "project", sshd.node(tmp_path / "node"))
    with provisioned_bot(tmp_path / "home", sshd, sshd.dispatcher(known_hosts=known)) as bot:
        run_id = submit(bot, manifest)
        with pytest.raises(DispatchError, match="host key refused"):
            bot.service.starter.start(run_id)
        run = bot.store.get_run(run_id)
        assert run["status"] == "dispatch_failed"
        assert "known_hosts" in run["first_error"]["message"]
        assert not (tmp_path / "node").exists()  # nothing was uploaded


def test_pinned_fingerprint_accepts_the_right_key_and_refuses_another(tmp_path: Path,
                                                                      sshd: Sshd) -> None:
    empty = tmp_path / "empty_known_hosts"
    empty.write_text("")
    good = write_project(tmp_path / "good", sshd.node(tmp_path / "node",
                                                      host_key_fingerprint=sshd.fingerprint()),
                         name="pinned-good")
    wrong = "SHA256:" + "A" * 43
    bad = write_project(tmp_path / "bad", sshd.node(tmp_path / "node2", host_key_fingerprint=wrong),
                        name="pinned-bad")
    with provisioned_bot(tmp_path / "home", sshd, sshd.dispatcher(known_hosts=empty)) as bot:
        ok = start_run(bot, good)
        assert bot.service.follower.follow(ok, timeout=60)["outcome"] == "passed"
        refused = submit(bot, bad)
        with pytest.raises(DispatchError, match="pinned node.host_key_fingerprint"):
            bot.service.starter.start(refused)


def test_unknown_host_key_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    manifest = write_project(tmp_path / "project", sshd.node(tmp_path / "node"))
    with provisioned_bot(tmp_path / "home", sshd, sshd.dispatcher(known_hosts=empty)) as bot:
        with pytest.raises(DispatchError, match="host key refused"):
            bot.service.starter.start(submit(bot, manifest))


def test_dispatch_to_a_lease_not_provisioned_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    manifest = write_project(tmp_path / "project", sshd.node(tmp_path / "node"))
    bot = make_bot(tmp_path / "home", sshd.dispatcher())
    try:
        run_id = submit(bot, manifest)
        with pytest.raises(LeaseError, match="not provisioned"):
            bot.service.starter.start(run_id)
        lease = bot.store.current_lease(sshd.lease_key)
        assert lease is not None and lease["state"] == "ordered" and lease["days"] == 3
        for state in ("payment-notified", "funds-confirmed"):
            from bot.service.leases import set_state

            set_state(bot.store, sshd.lease_key, state, "alice")
            with pytest.raises(LeaseError, match=f"'{state}'"):
                bot.service.starter.start(run_id)
        assert bot.store.get_run(run_id)["status"] == "planned"
        assert not (tmp_path / "node").exists()
    finally:
        bot.close()


def test_a_runner_that_died_on_the_node_is_quoted_from_the_nodes_log(tmp_path: Path,
                                                                      sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir), die_after=2)
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["outcome"] == "failed" and run["first_error"]["type"] == "RunnerExited"
        # runner.log exists on the node only: the dispatcher read its tail over SSH
        assert not (Path(run["run_dir"]) / "runner.log").exists()
        assert "out of patience at item 2" in run["first_error"]["message"]
        handle = RunHandle(run_id, Path(run["run_dir"]), Path(run["spec_path"]),
                           Path(run["run_dir"]), node=run["node"])
        assert bot.dispatcher.log_tail(handle).endswith("out of patience at item 2\n")
        assert bot.dispatcher.log_tail(handle, limit=10) == "at item 2\n"
