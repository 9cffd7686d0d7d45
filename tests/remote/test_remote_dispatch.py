"""The SSH dispatcher against a real sshd: upload, detached start, follow, fetch back."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.errors import DispatchError, LeaseError
from tests.remote.remote_kit import make_bot, provision, submit, write_project
from tests.remote.sshd_server import BARE_PYTHON, Sshd


def test_fake_runner_dispatched_end_to_end_with_the_node_python(tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    bot = make_bot(tmp_path / "home", sshd.dispatcher())
    try:
        provision(bot.store)
        run_id = submit(bot, manifest)
        bot.service.start(run_id)
        run = bot.service.follow(run_id, timeout=60)
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
    finally:
        bot.close()


def test_second_dispatch_uploads_only_the_run_files(tmp_path: Path, sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    project = tmp_path / "project"
    manifest = write_project(project, sshd.node(workdir))
    bot = make_bot(tmp_path / "home", sshd.dispatcher())
    try:
        provision(bot.store)
        first = submit(bot, manifest)
        bot.service.start(first)
        bot.service.follow(first, timeout=60)
        assert bot.dispatcher.uploaded[first]["project"] > 0
        assert bot.dispatcher.uploaded[first]["runner"] > 0
        second = submit(bot, manifest)
        bot.service.start(second)
        bot.service.follow(second, timeout=60)
        sent = bot.dispatcher.uploaded[second]
        assert sent["project"] == 0 and sent["runner"] == 0 and sent["run"] > 0
        # a changed input is uploaded again, a removed one disappears from the node
        (project / "data" / "pilote" / "doc-01.txt").write_text("contract changed")
        (project / "src" / "app.py").unlink()
        third = submit(bot, manifest)
        bot.service.start(third)
        bot.service.follow(third, timeout=60)
        assert bot.dispatcher.uploaded[third]["project"] == len("contract changed")
        remote_project = next((workdir / "projects").iterdir())
        assert not (remote_project / "src" / "app.py").exists()
        assert (remote_project / "data" / "pilote" / "doc-01.txt").read_text() == "contract changed"
    finally:
        bot.close()


def test_changed_host_key_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    other = tmp_path / "other_key"
    import subprocess

    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(other)], check=True)
    pub = (tmp_path / "other_key.pub").read_text().split()
    known = tmp_path / "known_hosts"
    known.write_text(f"[127.0.0.1]:{sshd.port} {pub[0]} {pub[1]}\n")
    manifest = write_project(tmp_path / "project", sshd.node(tmp_path / "node"))
    bot = make_bot(tmp_path / "home", sshd.dispatcher(known_hosts=known))
    try:
        provision(bot.store)
        run_id = submit(bot, manifest)
        with pytest.raises(DispatchError, match="host key refused"):
            bot.service.start(run_id)
        run = bot.store.get_run(run_id)
        assert run["status"] == "dispatch_failed"
        assert "known_hosts" in run["first_error"]["message"]
        assert not (tmp_path / "node").exists()  # nothing was uploaded
    finally:
        bot.close()


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
    bot = make_bot(tmp_path / "home", sshd.dispatcher(known_hosts=empty))
    try:
        provision(bot.store)
        ok = submit(bot, good)
        bot.service.start(ok)
        assert bot.service.follow(ok, timeout=60)["outcome"] == "passed"
        refused = submit(bot, bad)
        with pytest.raises(DispatchError, match="pinned node.host_key_fingerprint"):
            bot.service.start(refused)
    finally:
        bot.close()


def test_unknown_host_key_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    empty = tmp_path / "known_hosts"
    empty.write_text("")
    manifest = write_project(tmp_path / "project", sshd.node(tmp_path / "node"))
    bot = make_bot(tmp_path / "home", sshd.dispatcher(known_hosts=empty))
    try:
        provision(bot.store)
        with pytest.raises(DispatchError, match="host key refused"):
            bot.service.start(submit(bot, manifest))
    finally:
        bot.close()


def test_dispatch_to_a_lease_not_provisioned_is_refused(tmp_path: Path, sshd: Sshd) -> None:
    manifest = write_project(tmp_path / "project", sshd.node(tmp_path / "node"))
    bot = make_bot(tmp_path / "home", sshd.dispatcher())
    try:
        run_id = submit(bot, manifest)
        with pytest.raises(LeaseError, match="not provisioned"):
            bot.service.start(run_id)
        lease = bot.store.current_lease("127.0.0.1")
        assert lease is not None and lease["state"] == "ordered" and lease["days"] == 3
        for state in ("payment-notified", "funds-confirmed"):
            from bot.leases import set_state

            set_state(bot.store, "127.0.0.1", state, "alice")
            with pytest.raises(LeaseError, match=f"'{state}'"):
                bot.service.start(run_id)
        assert bot.store.get_run(run_id)["status"] == "planned"
        assert not (tmp_path / "node").exists()
    finally:
        bot.close()
