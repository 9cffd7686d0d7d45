"""Review findings: resume, the balance re-check of a training pilot, show, bad CLI input."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from bot.errors import RunNotFound
from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.service import PilotService
from bot.service.handles import handle_for
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest
from tests.e2e.test_pilot_cli import preflight

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]


def make(tmp_path: Path, script: Any, **kw: Any) -> tuple[PilotService, ScriptedDispatcher]:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    dispatcher = ScriptedDispatcher(script, **kw)
    service = PilotService(settings, Store(settings.db_path), {"local": dispatcher},
                           RecordingNotifier())
    return service, dispatcher


def start(service: PilotService, manifest: Path) -> str:
    sub = service.submit(load_manifest_file(manifest), submitter="bob")
    service.starter.start(sub.run_id)
    return sub.run_id


def test_resume_after_a_finished_attempt_follows_the_new_runner(tmp_path: Path) -> None:
    # The resumed runner reports only the item the first attempt lost (its ledger has the rest).
    attempts = [pilot_script(IDS, refuse=(), drop=("doc-02",)),
                pilot_script(IDS, refuse=(), drop=("doc-01", "doc-03", "doc-04"), lie=True)]
    service, _ = make(tmp_path, lambda run: attempts.pop(0), step=3)
    run_id = start(service, write_manifest(tmp_path))
    first = service.follower.follow(run_id, timeout=30)
    assert (first["status"], first["outcome"]) == ("awaiting_decision", "failed")
    seen = first["last_seq"]
    service.resume(run_id)
    run = service.follower.follow(run_id, timeout=30)
    # The resumed runner's events are all consumed: the old run.finished does not end it.
    assert run["last_seq"] > seen and not service.dispatchers["local"].is_alive(
        handle_for(service.store.run_record(run_id)))
    assert (run["status"], run["outcome"]) == ("awaiting_decision", "passed")


def test_resume_clears_the_first_error_of_the_dead_attempt(tmp_path: Path) -> None:
    attempts = [pilot_script(IDS, refuse=(), finish=False),
                pilot_script(IDS, refuse=(), drop=tuple(IDS), lie=True)]
    service, _ = make(tmp_path, lambda run: attempts.pop(0))
    run_id = start(service, write_manifest(tmp_path))
    assert service.follower.follow(run_id, timeout=30)["first_error"]["type"] == "RunnerExited"
    service.resume(run_id)
    run = service.follower.follow(run_id, timeout=30)
    assert run["outcome"] == "passed"
    assert run["first_error"] is None


TRAIN = """apiVersion: preflight/v1
name: trainer
purpose: training
hardware: {gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0"}
backend: cpu
preparation: pytorch
inputs: {dir: shards, pattern: "shard-*.csv", expected_count: 2}
task: {kind: train, handler: "runner.workloads.train:handle", steps: 3, resume_steps: 2}
success: {min_accepted: 2, max_refused: 0, balance_ok: true}
approvals: {approvers: [alice]}
"""


def test_training_pilot_without_categories_passes_the_recheck(tmp_path: Path) -> None:
    (tmp_path / "shards").mkdir()
    for n in (1, 2):
        (tmp_path / "shards" / f"shard-{n}.csv").write_text("x,y\n1,2\n", encoding="utf-8")
    path = tmp_path / "train.yaml"
    path.write_text(TRAIN, encoding="utf-8")
    ids = ["shard-1", "shard-2"]
    service, _ = make(tmp_path, lambda run: pilot_script(ids, refuse=(), category="train"))
    run = service.follower.follow(start(service, path), timeout=30)
    assert run["balance"]["recheck"]["ok"] is True, run["balance"]["problems"]
    assert run["outcome"] == "passed"


def test_ambiguous_prefix_says_so(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    a = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob").run_id
    b = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob").run_id
    with pytest.raises(RunNotFound, match="matches 2 runs") as info:
        service.store.find_run(a[:4])
    assert a in str(info.value) and b in str(info.value)


def test_dispatch_failed_run_shows_why(tmp_path: Path) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    sub = service.submit(load_manifest_file(write_manifest(tmp_path)), submitter="bob")
    service.store.update_run(sub.run_id, node={"kind": "nowhere"})
    with pytest.raises(Exception, match="no dispatcher"):
        service.starter.start(sub.run_id)
    service.store.transition(sub.run_id, ("planned",), "dispatching")
    service.store.transition(sub.run_id, ("dispatching",), "dispatch_failed",
                             first_error={"stage": "dispatch", "type": "DispatchError",
                                          "message": "cannot start the runner"})
    keys = [m.key for m in service.publisher.thread_messages(sub.run_id)]
    assert "first_error" in keys


def show_output(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, run_id: str) -> str:
    from bot.cli.app import app

    for key in ("PREFLIGHT_DB", "PREFLIGHT_RUNS_DIR", "PREFLIGHT_JOBS_DB"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("PREFLIGHT_HOME", str(tmp_path))
    monkeypatch.setenv("COLUMNS", "150")
    result = CliRunner().invoke(app, ["show", run_id])
    assert result.exit_code == 0, result.output
    return result.output


def test_show_prints_the_decision_once_and_only_when_one_can_be_made(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    service, _ = make(tmp_path, lambda run: pilot_script(IDS, refuse=()))
    manifest = write_manifest(tmp_path)
    done = start(service, manifest)
    service.follower.follow(done, timeout=30)
    planned = service.submit(load_manifest_file(manifest), submitter="bob").run_id
    out = show_output(tmp_path, monkeypatch, done)
    assert out.count("Approve scale-up") == 1
    assert "Approve scale-up" not in show_output(tmp_path, monkeypatch, planned)


def test_unusable_state_database_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "state").write_text("not a directory")
    done = preflight(tmp_path, "runs")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert "state" in done.stderr
