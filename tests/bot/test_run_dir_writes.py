"""The bot never writes through a link left in a run or evidence directory (the team's
code writes there too): temporary file + rename, or ``O_NOFOLLOW`` (docs/security.md,
"What comes back from a node")."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import mirror, verify_fetched
from bot.errors import DispatchError
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.nodes.local import LocalDispatcher
from bot.service import PilotService
from bot.service.handles import handle_for
from bot.service.report_files import ReportError, add_to_evidence
from bot.settings import Settings
from bot.store import Store
from runner.evidence import SUMS
from runner.files import temp_path, write_text_atomic
from tests.bot.fakes import write_manifest

BASHRC = "# the bot user's shell\n"


@pytest.fixture
def bashrc(tmp_path: Path) -> Path:
    path = tmp_path / "bot-home" / ".bashrc"
    path.parent.mkdir()
    path.write_text(BASHRC, encoding="utf-8")
    return path


def handle(tmp_path: Path) -> RunHandle:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True, exist_ok=True)
    return RunHandle("r1", run_dir, run_dir / "spec.json", tmp_path)


def test_an_atomic_write_refuses_a_link_planted_under_its_temporary_name(
        tmp_path: Path, bashrc: Path) -> None:
    final = tmp_path / "remote.json"
    os.symlink(bashrc, temp_path(final))
    with pytest.raises(OSError):
        write_text_atomic(final, "payload\n")
    assert bashrc.read_text(encoding="utf-8") == BASHRC and not final.exists()


def test_the_events_mirror_is_never_written_through_a_link(tmp_path: Path,
                                                            bashrc: Path) -> None:
    h = handle(tmp_path)
    (h.run_dir / "events.jsonl").symlink_to(bashrc)
    with pytest.raises(DispatchError, match="events.jsonl: cannot write"):
        mirror(h.run_dir / "events.jsonl", 0, b"echo owned\n")
    assert bashrc.read_text(encoding="utf-8") == BASHRC


def test_the_fetched_evidence_report_replaces_a_link_instead_of_following_it(
        tmp_path: Path, bashrc: Path) -> None:
    h = handle(tmp_path)
    (h.run_dir / "evidence-fetch.json").symlink_to(bashrc)
    with pytest.raises(DispatchError, match="does not verify"):
        verify_fetched(h, tmp_path / "no-such-copy")
    assert bashrc.read_text(encoding="utf-8") == BASHRC
    report = h.run_dir / "evidence-fetch.json"
    assert not report.is_symlink() and '"ok": false' in report.read_text(encoding="utf-8")


def test_a_local_resume_never_appends_the_runner_log_through_a_link(
        tmp_path: Path, bashrc: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "project")})
    local = LocalDispatcher(sys.executable, env=dict(Settings.from_env().runner_env))
    service = PilotService(settings, Store(settings.db_path), {"local": local},
                           RecordingNotifier())
    loaded = load_manifest_file(write_manifest(tmp_path / "project"))
    run = service.store.run_record(service.submit(loaded, submitter="bob").run_id)
    h = handle_for(run, resume=True)
    (h.run_dir / "runner.log").symlink_to(bashrc)  # left by the run's code before
    with pytest.raises(DispatchError, match="runner.log"):
        local.start(h)
    assert bashrc.read_text(encoding="utf-8") == BASHRC


def test_a_linked_sha256sums_in_the_evidence_copy_is_neither_read_nor_written(
        tmp_path: Path, bashrc: Path) -> None:
    copy = tmp_path / "evidence" / "r1"
    copy.mkdir(parents=True)
    (copy / SUMS).symlink_to(bashrc)
    with pytest.raises(ReportError, match=SUMS):
        add_to_evidence(copy, "report.html", b"<html></html>")
    assert bashrc.read_text(encoding="utf-8") == BASHRC
