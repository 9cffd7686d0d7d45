"""A node whose SSH answers are the team's (issue 32): once its code ran there as the
login user, a ``command="…"`` prefix in ``~/.ssh/authorized_keys`` routes every session,
the SFTP subsystem included, through a program of theirs. Here that program
(``forced_command.py``) sits between sshd and the real sftp-server and rewrites the names
of the run directory's listing as an attacker would; the fetch refuses them, naming the
node and the path, and writes or removes nothing on the bot host outside the run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bot.cli.app import app
from bot.dispatch.bot_records import BOT_RECORDS
from bot.dispatch.evidence_home import EvidenceHomeRefused
from bot.service.handles import handle_for
from bot.settings import Settings
from bot.store import Store
from tests.remote.remote_kit import provisioned_bot, start_run, write_project
from tests.remote.sshd_server import BARE_PYTHON, Sshd, running_sshd
from tests.remote.test_remote_results import with_plants

FORCED = Path(__file__).resolve().with_name("forced_command.py")
RENAMES = {"decoy.txt": "../../victim.txt", "decoy-dir": "../../keep"}


def test_a_node_that_renames_its_listing_writes_and_removes_nothing_outside_the_run(
        tmp_path: Path) -> None:
    plan = tmp_path / "renames.json"
    plan.write_text(json.dumps({"names": RENAMES}), encoding="utf-8")
    home = tmp_path / "home"  # the bot's: runs/ and state/ live here
    (home / "keep").mkdir(parents=True)
    (home / "keep" / "canary").write_text("the bot's own folder\n", encoding="utf-8")
    (home / "victim.txt").write_text("the bot's own file\n", encoding="utf-8")
    workdir = tmp_path / "node"  # what the renamed paths lead to on the node
    (workdir / "keep").mkdir(parents=True)
    (workdir / "keep" / "from-node").write_text("node bytes\n", encoding="utf-8")
    (workdir / "victim.txt").write_text("node bytes\n", encoding="utf-8")
    with running_sshd(tmp_path / "sshd") as sshd:
        key = (sshd.root / "user_ed25519.pub").read_text(encoding="utf-8")
        (sshd.root / "authorized_keys").write_text(
            f'command="{BARE_PYTHON} {FORCED} {plan}" {key}', encoding="utf-8")
        manifest = with_plants(write_project(tmp_path / "project", sshd.node(workdir)),
                               [{"path": "decoy.txt", "bytes": 5},
                                {"path": "decoy-dir/x", "bytes": 3}])
        with provisioned_bot(home, sshd) as bot:
            run_id = start_run(bot, manifest)
            run = bot.service.follower.follow(run_id, timeout=60)
    assert (home / "victim.txt").read_text(encoding="utf-8") == "the bot's own file\n"
    assert (home / "keep" / "canary").is_file() and not (home / "keep" / "from-node").exists()
    error = run["evidence"]["fetch_error"]
    assert f"{sshd.user}@127.0.0.1:{sshd.port}: the node answered the name " in error, error
    assert "'../../victim.txt'" in error or "'../../keep'" in error, error
    assert f"{workdir}/runs/{run_id}" in error and "nothing was written or removed" in error
    assert run["outcome"] == "failed"  # the fetch refused: never PASSED on its word
    # what was recorded stays: the verdict from the events, the copy's refusal said
    assert run["verdict"]["checks"] and not (Path(run["run_dir"]) / ".fetch").exists()


def _without_fetched(data: bytes) -> dict[str, object]:
    layout = json.loads(data)
    assert isinstance(layout, dict) and "forged" not in layout, layout
    layout.pop("fetched", None)
    return layout


def test_no_record_of_the_bot_is_ever_replaced_by_the_node_s_copy(
        tmp_path: Path, sshd: Sshd) -> None:
    """Each of the bot's own records (``BOT_RECORDS``), forged in the node's run
    directory, stays the bot's after a fetch; the node's other files come back."""
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        local, remote = Path(run["run_dir"]), workdir / "runs" / run_id
        kept = {name: (local / name).read_bytes() if (local / name).exists() else None
                for name in BOT_RECORDS}
        assert kept["inputs.checked.json"] and kept["spec.json"] and kept["remote.json"]
        for name in BOT_RECORDS:
            (remote / name).write_text('{"forged": "by the node"}\n', encoding="utf-8")
        (remote / "runner.log").write_text("the node's own log\n", encoding="utf-8")
        bot.dispatcher.fetch_results(handle_for(bot.store.run_record(run_id)))
    for name, data in kept.items():
        now = (local / name).read_bytes() if (local / name).exists() else None
        if name == "remote.json" and now is not None and data is not None:
            # the bot's own fetch measures what it carried there ("fetched"), its own record
            now, data = (_without_fetched(now), _without_fetched(data))
        assert now == data, name
    assert (local / "runner.log").read_text(encoding="utf-8") == "the node's own log\n"


def test_a_refused_fetch_loses_nothing_and_preflight_fetch_tries_again(
        tmp_path: Path, sshd: Sshd, monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetch at the run's end is refused (a FIFO in the node's run directory): the
    events, balance and verdict stay recorded, the verdict says why the copy was refused;
    once the node's results are fixed, `preflight fetch RUN` brings them back and the
    pilot, still awaiting its decision, is judged again on them."""
    workdir = tmp_path / "node"
    manifest = with_plants(write_project(tmp_path / "project", sshd.node(workdir)),
                           [{"path": "pipe", "fifo": True}])
    home = tmp_path / "home"
    with provisioned_bot(home, sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        events = [e.seq for e in bot.store.events(run_id)]
    assert run["status"] == "awaiting_decision" and run["outcome"] == "failed"
    assert run["balance"]["ok"] is True and events
    why = run["evidence"]["fetch_error"]
    assert "'pipe', which is a FIFO" in why
    [check] = [c for c in run["verdict"]["checks"] if not c["ok"]]
    assert check["text"].startswith("the results were not brought back from the node: ")
    assert f"`preflight fetch {run_id}` tries again" in check["text"]
    (workdir / "runs" / run_id / "pipe").unlink()  # the node's results set right
    monkeypatch.setenv("PREFLIGHT_HOME", str(home))
    monkeypatch.setenv("PREFLIGHT_SSH_KNOWN_HOSTS", str(sshd.known_hosts))
    monkeypatch.setenv("PREFLIGHT_SSH_KEYS", str(sshd.user_key))
    done = CliRunner().invoke(app, ["fetch", run_id])
    assert done.exit_code == 0, done.output
    assert f"run {run_id}: results fetched" in done.output
    store = Store(Settings.from_env({"PREFLIGHT_HOME": str(home)}).db_path)
    after = store.get_run(run_id)
    assert [e.seq for e in store.events(run_id)] == events  # nothing lost
    store.close()
    assert after["outcome"] == "passed" and "fetch_error" not in (after["evidence"] or {})
    assert all(c["ok"] for c in after["verdict"]["checks"])
    assert (Path(after["run_dir"]) / "runner.log").exists()  # the results are here now


def test_the_fetch_refuses_an_evidence_home_that_is_the_run_directory(
        tmp_path: Path, sshd: Sshd) -> None:
    """A run recorded before the manifest's rule (its layout's evidence home is its own
    run directory): the fetch refuses before a byte moves and the bot's records stay."""
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir),
                             copy_to=str(tmp_path / "evidence"))
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        local = Path(run["run_dir"])
        layout = json.loads((local / "remote.json").read_text(encoding="utf-8"))
        layout["evidence"]["local"] = str(local.parent)  # home: runs/<run id>, the run dir
        (local / "remote.json").write_text(json.dumps(layout), encoding="utf-8")
        kept = {n: (local / n).read_bytes() for n in ("spec.json", "remote.json")}
        with pytest.raises(EvidenceHomeRefused) as caught:
            bot.dispatcher.fetch_results(handle_for(bot.store.run_record(run_id)))
    assert f"run {run_id}: the evidence copy would be fetched to {local}" in str(caught.value)
    assert "it is the run directory" in str(caught.value)
    assert {n: (local / n).read_bytes() for n in kept} == kept
