"""The real runner and the 12-document pilot, dispatched through a real sshd, end to end."""

from __future__ import annotations

from pathlib import Path

from runner.evidence import verify_evidence
from tests.remote.remote_kit import pilote_bot, start_run
from tests.remote.sshd_server import BARE_PYTHON, Sshd


def test_pilote_dispatched_over_ssh_evidence_fetched_and_verified(tmp_path: Path,
                                                                  sshd: Sshd) -> None:
    workdir, evidence = tmp_path / "node", tmp_path / "evidence"
    with pilote_bot(tmp_path, sshd) as (bot, pilote):
        run_id = start_run(bot, pilote, submitter="alice")
        run = bot.service.follower.follow(run_id, timeout=120)
        assert run["outcome"] == "passed", (run["first_error"], run["verdict"])
        assert (run["balance"]["accepted"], run["balance"]["refused"]) == (11, 1)
        assert run["evidence"]["verified"]
        # the copy came back to the bot host and verifies there, away from the node
        report = verify_evidence(str(evidence / run_id))
        assert report.ok, report.problems
        # "Copied to" names that verified copy on the bot's side, the node's path beside it
        assert run["evidence"]["dest"] == str(evidence / run_id)
        assert run["evidence"]["node_dest"] != run["evidence"]["dest"]
        panel = {m.key: m for m in bot.service.publisher.thread_messages(run_id)}["evidence"]
        fields = dict(next(b for b in panel.blocks if hasattr(b, "pairs")).pairs)
        assert fields["Copied to"] == str(evidence / run_id)
        assert (Path(run["run_dir"]) / "balance.csv").exists()
        uploaded = {p.name for p in (workdir / "projects").iterdir()}
        assert len(uploaded) == 1
        remote_project = workdir / "projects" / uploaded.pop()
        assert (remote_project / "data" / "pilote").is_dir()
        assert not (remote_project / ".venv").exists() and not (remote_project / ".git").exists()


def test_bare_node_without_torch_reports_the_stage_instead_of_dying(tmp_path: Path,
                                                                     sshd: Sshd) -> None:
    with pilote_bot(tmp_path, sshd, BARE_PYTHON) as (bot, pilote):
        run_id = start_run(bot, pilote, submitter="alice")
        run = bot.service.follower.follow(run_id, timeout=120)
        assert run["outcome"] == "failed"
        error = run["first_error"]
        assert error["stage"] in ("environment", "torch") and "torch" in error["message"], error
