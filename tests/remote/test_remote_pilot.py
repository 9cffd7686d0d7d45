"""The real runner and the 12-document pilot, dispatched through a real sshd, end to end."""

from __future__ import annotations

import sys
from pathlib import Path

from bot.manifest.load import load_manifest
from runner.evidence import verify_evidence
from tests.remote.remote_kit import make_bot, provision
from tests.remote.sshd_server import BARE_PYTHON, Sshd

REPO = Path(__file__).resolve().parents[2]


def pilote_over_ssh(sshd: Sshd, workdir: Path, evidence: Path, python: str) -> str:
    """manifests/pilote.yaml with its node turned into this sshd and a local evidence copy."""
    text = (REPO / "manifests" / "pilote.yaml").read_text(encoding="utf-8")
    node = (f"node:\n  kind: ssh\n  host: 127.0.0.1\n  port: {sshd.port}\n  user: {sshd.user}\n"
            f"  workdir: {workdir}\n  python: {python}\n")
    assert "node:\n  kind: local\n" in text and "copy_to: evidence/pilote-demo" in text
    return (text.replace("node:\n  kind: local\n", node)
            .replace("copy_to: evidence/pilote-demo", f"copy_to: {evidence}"))


def test_pilote_dispatched_over_ssh_evidence_fetched_and_verified(tmp_path: Path,
                                                                  sshd: Sshd) -> None:
    from bot.dispatch.ssh import RUNNER_PACKAGE

    workdir, evidence = tmp_path / "node", tmp_path / "evidence"
    text = pilote_over_ssh(sshd, workdir, evidence, sys.executable)
    bot = make_bot(tmp_path / "home", sshd.dispatcher(runner_package=RUNNER_PACKAGE))
    try:
        provision(bot.store, sshd.lease_key)
        loaded = load_manifest(text, source="pilote-ssh.yaml", base_dir=REPO / "manifests")
        run_id = bot.service.submit(loaded, submitter="alice").run_id
        bot.service.start(run_id)
        run = bot.service.follow(run_id, timeout=120)
        assert run["outcome"] == "passed", (run["first_error"], run["verdict"])
        assert (run["balance"]["accepted"], run["balance"]["refused"]) == (11, 1)
        assert run["evidence"]["verified"]
        # the copy came back to the bot host and verifies there, away from the node
        report = verify_evidence(str(evidence / run_id))
        assert report.ok, report.problems
        # "Copied to" names that verified copy on the bot's side, the node's path beside it
        assert run["evidence"]["dest"] == str(evidence / run_id)
        assert run["evidence"]["node_dest"] != run["evidence"]["dest"]
        panel = {m.key: m for m in bot.service.thread_messages(run_id)}["evidence"]
        fields = dict(next(b for b in panel.blocks if hasattr(b, "pairs")).pairs)
        assert fields["Copied to"] == str(evidence / run_id)
        assert (Path(run["run_dir"]) / "balance.csv").exists()
        uploaded = {p.name for p in (workdir / "projects").iterdir()}
        assert len(uploaded) == 1
        remote_project = workdir / "projects" / uploaded.pop()
        assert (remote_project / "data" / "pilote").is_dir()
        assert not (remote_project / ".venv").exists() and not (remote_project / ".git").exists()
    finally:
        bot.close()


def test_bare_node_without_torch_reports_the_stage_instead_of_dying(tmp_path: Path,
                                                                     sshd: Sshd) -> None:
    from bot.dispatch.ssh import RUNNER_PACKAGE

    workdir, evidence = tmp_path / "node", tmp_path / "evidence"
    text = pilote_over_ssh(sshd, workdir, evidence, BARE_PYTHON)
    bot = make_bot(tmp_path / "home", sshd.dispatcher(runner_package=RUNNER_PACKAGE))
    try:
        provision(bot.store, sshd.lease_key)
        loaded = load_manifest(text, source="pilote-ssh.yaml", base_dir=REPO / "manifests")
        run_id = bot.service.submit(loaded, submitter="alice").run_id
        bot.service.start(run_id)
        run = bot.service.follow(run_id, timeout=120)
        assert run["outcome"] == "failed"
        error = run["first_error"]
        assert error["stage"] in ("environment", "torch") and "torch" in error["message"], error
    finally:
        bot.close()
