"""What a node says is a claim: a forged ``evidence`` event cannot send the bot's writes
anywhere but where the bot put the evidence (docs/security.md, "What comes back from a
node")."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.messages.views import evidence_message
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store
from runner.evidence import SUMS, copy_evidence
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]


def tree_digest(root: Path) -> dict[str, str]:
    """Every entry under ``root`` and what it holds (links by their target)."""
    out = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = "link:" + str(path.readlink())
        elif path.is_file():
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            out[rel] = "dir"
    return out


def evidence_run(tmp_path: Path, claim: Any) -> tuple[PilotService, str]:
    """A pilot with results.copy_to whose "runner" copies its evidence where the bot sent
    it, then reports ``claim(run_id, real_dest)`` as the dest of its evidence event."""
    project = tmp_path / "project"
    settings = Settings.from_env({"PREFLIGHT_HOME": str(project)})

    def script(run_id: str) -> list[dict[str, Any]]:
        events = pilot_script(IDS, refuse=())
        real = project / "evidence" / run_id
        run_dir = settings.runs_dir / run_id
        (run_dir / "balance.json").write_text("{}", encoding="utf-8")
        report = copy_evidence(str(run_dir), str(real))
        at = next(i for i, e in enumerate(events) if e.get("stage") == "evidence")
        events[at:at + 1] = [
            {"type": "stage.started", "stage": "evidence"},
            {"type": "evidence", "dest": claim(run_id, real), "files": report.files,
             "bytes": report.bytes, "verified": True, "problems": []},
            {"type": "stage.passed", "stage": "evidence", "facts": {"verified": True}}]
        return events

    service = PilotService(settings, Store(settings.db_path),
                           {"local": ScriptedDispatcher(script)}, RecordingNotifier())
    loaded = load_manifest_file(write_manifest(project, copy_to=True))
    run_id = service.submit(loaded, submitter="bob").run_id
    service.starter.start(run_id)
    return service, run_id


def test_a_forged_evidence_dest_writes_nothing_outside_the_bots_evidence_folder(
        tmp_path: Path) -> None:
    victim = tmp_path / "bot-home" / "notes"  # any folder that holds a SHA256SUMS
    victim.mkdir(parents=True)
    (victim / SUMS).write_text("0" * 64 + "  keep\n", encoding="utf-8")
    (victim / "keep").write_text("the bot user's own file\n", encoding="utf-8")
    before = tree_digest(tmp_path / "bot-home")
    service, run_id = evidence_run(tmp_path, lambda run_id, real: str(victim))
    run = service.follower.follow(run_id, timeout=30)
    assert tree_digest(tmp_path / "bot-home") == before  # no report.html, SUMS untouched
    evidence = run["evidence"]
    home = str(tmp_path / "project" / "evidence" / run_id)
    assert evidence["dest"] == home and evidence["node_dest"] == str(victim)
    assert evidence["verified"] is False
    assert str(victim) in evidence["dest_refused"] and home in evidence["dest_refused"]
    assert run["outcome"] == "failed"  # the evidence copy is not verified
    assert (Path(run["run_dir"]) / "report.html").is_file()  # the report stays local


def test_an_honest_evidence_dest_gets_the_report_added(tmp_path: Path) -> None:
    service, run_id = evidence_run(tmp_path, lambda run_id, real: str(real))
    run = service.follower.follow(run_id, timeout=30)
    home = tmp_path / "project" / "evidence" / run_id
    assert run["evidence"]["dest"] == str(home) and "dest_refused" not in run["evidence"]
    assert run["evidence"]["verified"] is True and run["outcome"] == "passed"
    assert (home / "report.html").is_file()
    assert "  report.html" in (home / SUMS).read_text(encoding="utf-8")


def test_url_evidence_from_an_ssh_node_is_recorded_as_the_node_s_claim(
        tmp_path: Path) -> None:
    """``copy_to: memory://…`` on an SSH node: the node copied and checked the evidence
    itself, and the bot host never read it. Its ``verified: true`` stays the node's
    word, said in the record, the verdict and the thread (issue 32)."""
    def script(run_id: str) -> list[dict[str, Any]]:
        events = pilot_script(IDS, refuse=())
        at = next(i for i, e in enumerate(events) if e.get("stage") == "evidence")
        events[at:at + 1] = [
            {"type": "stage.started", "stage": "evidence"},
            {"type": "evidence", "dest": f"memory://bucket/ev/{run_id}", "files": 7,
             "bytes": 100, "verified": True, "problems": []},
            {"type": "stage.passed", "stage": "evidence", "facts": {"verified": True}}]
        return events

    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "home")})
    service = PilotService(settings, Store(settings.db_path),
                           {"ssh": ScriptedDispatcher(script)}, RecordingNotifier())
    manifest = write_manifest(tmp_path / "project", extra=(
        "results: {copy_to: 'memory://bucket/ev'}\n"
        "node: {kind: ssh, host: gpu-1.example, workdir: /srv/w}"))
    run_id = service.submit(load_manifest_file(manifest), submitter="bob").run_id
    service.starter.start(run_id)
    run = service.follower.follow(run_id, timeout=30)
    evidence = run["evidence"]
    assert evidence["dest"] == f"memory://bucket/ev/{run_id}"
    assert evidence["verified"] is True and evidence["verified_by"] == "node"
    [check] = [c for c in run["verdict"]["checks"] if "evidence" in c["text"]]
    assert check["text"].startswith("evidence copy verified as claimed by the node at "
                                    f"memory://bucket/ev/{run_id} (the bot host did not "
                                    "check it")
    message = evidence_message(service.store.run(run_id))
    assert message is not None
    assert "as claimed by the node (not checked by the bot host)" in repr(message.blocks)
