"""What comes back from a node is hostile (docs/security.md, "What comes back from a
node"): a team's code that leaves links, FIFOs or too much in its run directory gets the
fetch refused, naming the path and the run; nothing outside the run directory is read or
changed on the bot host and nothing of it reaches Slack."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from pathlib import Path
from typing import Any

from bot.errors import DispatchError
from bot.nodes.ssh.fetch import FetchLimits
from bot.service import PilotService
from bot.service.handles import handle_for
from bot.service.leases import lease_guard_for
from bot.settings import Settings
from bot.slack.app import make_client
from bot.slack.notifier import SlackNotifier
from bot.store import Store
from tests.remote.remote_kit import (
    Bot,
    pilote_bot,
    provision,
    provisioned_bot,
    start_run,
    submit,
    write_project,
)
from tests.remote.sshd_server import Sshd
from tests.slack.emulator import SlackEmulator

TOKEN = "xoxb-test-token"
CHANNEL = "C0PILOTS"
DEEP = "d/x/y/z/w"  # a run directory's depth below tmp_path is 3 (home|node/runs/<id>)


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` and what it holds (links by their target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "link:" + os.readlink(path)
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def bot_home(tmp_path: Path) -> tuple[Path, str]:
    """A fake home of the bot's user: a private key (the canary) and a .bashrc."""
    home = tmp_path / "bot-home"
    (home / ".ssh").mkdir(parents=True)
    canary = f"-----BEGIN OPENSSH PRIVATE KEY-----\nCANARY{secrets.token_hex(16)}\n"
    (home / ".ssh" / "id_ed25519").write_text(canary, encoding="utf-8")
    (home / ".bashrc").write_text("# the bot user's shell\n", encoding="utf-8")
    return home, canary.splitlines()[1]


def attack() -> list[dict[str, Any]]:
    """The links of issue 24: each passes asyncssh's text-only check (``up/..`` cancels
    out as text), and on the bot host they lead to the bot user's key and .bashrc."""
    return [
        {"path": f"{DEEP}/up", "link": "../../../../.."},  # the run directory itself
        {"path": f"{DEEP}/leak", "link": "up/../../../bot-home/.ssh/id_ed25519"},
        {"path": f"{DEEP}/rc", "link": "up/../../../bot-home/.bashrc"},
        {"path": "balance.csv", "link": f"{DEEP}/leak"},
        {"path": "evidence-fetch.json", "link": f"{DEEP}/rc"},  # written by verify_fetched
        {"path": "pipe", "fifo": True},
    ]


def with_plants(manifest: Path, plants: list[dict[str, Any]]) -> Path:
    data = json.loads(manifest.read_text(encoding="utf-8"))
    data["task"]["params"]["plant"] = plants
    manifest.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return manifest


def slack_bot(home: Path, sshd: Sshd, emulator: SlackEmulator) -> Bot:
    """A bot whose messages and uploads go to the Slack emulator."""
    settings = Settings.from_env({"PREFLIGHT_HOME": str(home)}).with_(
        slack_bot_token=TOKEN, slack_api_url=emulator.api_url)
    store = Store(settings.db_path)
    notifier = SlackNotifier(make_client(settings), store, min_interval=0.05)
    dispatcher = sshd.dispatcher()
    service = PilotService(settings, store, {"ssh": dispatcher}, notifier,
                           lease_guard=lease_guard_for(store))
    return Bot(settings, store, service, notifier, dispatcher)  # type: ignore[arg-type]


def test_links_and_fifos_left_by_the_team_refuse_the_fetch_and_leak_nothing(
        tmp_path: Path, sshd: Sshd) -> None:
    home, canary = bot_home(tmp_path)
    before = tree_digest(home)
    workdir = tmp_path / "node"
    manifest = with_plants(write_project(tmp_path / "project", sshd.node(workdir),
                                         copy_to=str(tmp_path / "evidence")), attack())
    with SlackEmulator(tokens=(TOKEN,)) as emulator:
        bot = slack_bot(tmp_path / "home", sshd, emulator)
        try:
            provision(bot.store, sshd.lease_key)
            run_id = submit(bot, manifest)
            bot.store.update_run(run_id, channel=CHANNEL,
                                 thread_ts=emulator.user_message(CHANNEL, "pilot", "U1"))
            bot.service.starter.start(run_id)
            run = bot.service.follower.follow(run_id, timeout=60)
            assert bot.notifier.flush(30)  # type: ignore[attr-defined]
        finally:
            bot.close()
            bot.notifier.close()  # type: ignore[attr-defined]
        run_dir = Path(run["run_dir"])
        assert run_dir.parent.parent.parent == tmp_path  # the links' depth holds
        assert run["evidence"], (run["status"], run["first_error"])
        error = run["evidence"]["fetch_error"]
        assert f"run {run_id}: the node's results hold " in error
        assert "only regular files and folders are fetched" in error
        assert any(f"'{p['path']}'" in error for p in attack()), error
        assert run["outcome"] == "failed"
        # nothing outside the run directory changed; nothing of the node's copy was kept
        assert tree_digest(home) == before
        assert not any(p.is_symlink() for p in run_dir.rglob("*"))
        assert not (run_dir / ".fetch").exists() and not (run_dir / "pipe").exists()
        # the canary never reached Slack, in a message or an upload; the refusal did
        sent = json.dumps([c.params for c in emulator.calls]) + repr(
            [f.get("content") for f in emulator.files.values()])
        assert canary not in sent
        assert emulator.files and "only regular files and folders are fetched" in json.dumps(
            [c.params for c in emulator.calls])


def test_each_entry_that_is_not_a_file_or_folder_is_refused_by_name(
        tmp_path: Path, sshd: Sshd) -> None:
    """After a normal run's fetch: a link, a FIFO, a link deep in a folder, a file over a
    cap each refuse the next fetch, naming the path; what was fetched before stays."""
    workdir = tmp_path / "node"
    manifest = write_project(tmp_path / "project", sshd.node(workdir))
    with provisioned_bot(tmp_path / "home", sshd) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=60)
        assert run["outcome"] == "passed", run["verdict"]  # a normal run fetches as before
        local, remote = Path(run["run_dir"]), workdir / "runs" / run_id
        assert (local / "exit_code").read_text().strip() == "0"
        assert (local / "events.jsonl").read_bytes() == (remote / "events.jsonl").read_bytes()
        handle = handle_for(bot.store.run_record(run_id))
        (remote / "out" / "deep").mkdir(parents=True)
        (remote / "out" / "deep" / "ok.txt").write_text("fetched\n")
        bot.dispatcher.fetch_results(handle)
        assert (local / "out" / "deep" / "ok.txt").read_text() == "fetched\n"
        (remote / "runner.log").write_text("the node's new log\n")
        kept = tree_digest(local)
        cases = [("out/deep/key", lambda p: p.symlink_to("/etc/hostname"),
                  "a symbolic link (to '/etc/hostname')"),
                 ("pipe", os.mkfifo, "a FIFO"),
                 ("sock", _socket, "a socket")]
        for rel, make, what in cases:
            make(remote / rel)
            try:
                bot.dispatcher.fetch_results(handle)
                raise AssertionError(f"{rel}: fetched")
            except DispatchError as exc:
                assert f"run {run_id}: the node's results hold '{rel}', which is {what}" \
                    in str(exc), str(exc)
            assert tree_digest(local) == kept  # nothing half-replaced
            os.unlink(remote / rel)
        # the size caps: per file, then in all
        (remote / "big.bin").write_bytes(b"x" * 5000)
        for limits, why in ((FetchLimits(total_bytes=10**9, file_bytes=4096),
                             "'big.bin': 5000 bytes, over the cap of 4096 bytes per file"),
                            (FetchLimits(total_bytes=4096, file_bytes=10**9),
                             "over the cap of 4096 bytes")):
            bot.dispatcher.fetch_limits = limits
            try:
                bot.dispatcher.fetch_results(handle)
                raise AssertionError("fetched over the cap")
            except DispatchError as exc:
                assert "the results on the node are too large" in str(exc)
                assert why in str(exc) and "PREFLIGHT_FETCH_MAX" in str(exc), str(exc)
            assert tree_digest(local) == kept
        bot.dispatcher.fetch_limits = FetchLimits()
        bot.dispatcher.fetch_results(handle)
        assert (local / "big.bin").stat().st_size == 5000
        assert (local / "runner.log").read_text() == "the node's new log\n"


def _socket(path: Path) -> None:
    """A Unix socket at ``path``: bound under a short name in the same temporary folder
    tree (a socket path has a length cap), then moved there."""
    import socket
    import tempfile

    short = Path(tempfile.mkdtemp(prefix="s", dir=tempfile.gettempdir())) / "s"
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(short))
    os.rename(short, path)
    short.parent.rmdir()


def test_a_link_in_the_nodes_evidence_copy_refuses_the_fetch_and_keeps_the_bots_copy(
        tmp_path: Path, sshd: Sshd) -> None:
    workdir, evidence = tmp_path / "node", tmp_path / "evidence"
    with pilote_bot(tmp_path, sshd) as (bot, pilote):
        run_id = start_run(bot, pilote, submitter="alice")
        run = bot.service.follower.follow(run_id, timeout=120)
        assert run["evidence"]["verified"], run["evidence"]
        kept = tree_digest(evidence)
        [node_copy] = (workdir / "evidence").glob(f"*/{run_id}")
        (node_copy / "outputs" / "leak").symlink_to("../../../../../bot-home/.bashrc")
        handle = handle_for(bot.store.run_record(run_id))
        try:
            bot.dispatcher.fetch_results(handle)
            raise AssertionError("fetched a link")
        except DispatchError as exc:
            assert f"run {run_id}: the node's results hold 'evidence copy " in str(exc)
            assert f"{run_id}/outputs/leak', which is a symbolic link" in str(exc), str(exc)
        assert tree_digest(evidence) == kept  # the verified copy stays as it was
