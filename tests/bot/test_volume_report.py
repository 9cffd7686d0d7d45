"""The volume's report names the pilot and the approval that launched it, its workers, pace
per worker, and its stops and resumes; the pilot's report names the volume it launched."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.manifest.load import load_manifest_file
from bot.messages.model import RecordingNotifier
from bot.messages.report import ReportData, render_report
from bot.service import PilotService
from bot.service.report_files import gather
from bot.settings import Settings
from bot.store import Store
from tests.bot.fakes import ScriptedDispatcher, pilot_script, write_manifest
from tests.bot.runs import run_of
from tests.bot.test_report import parse

IDS = ["doc-01", "doc-02", "doc-03", "doc-04"]
VOLUME = 'volume: {inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 4}}'
WORKERS = [{"worker": "w0", "node": "n0", "host": "127.0.0.1", "cards": []},
           {"worker": "w1", "node": "n0", "host": "127.0.0.1", "cards": []}]


def _script(run_id: str) -> list[dict[str, Any]]:
    events = pilot_script(IDS, refuse=())
    if run_id.endswith("-v1"):  # the volume: its driver says which workers it started
        at = events.index({"type": "stage.started", "stage": "pilot"}) + 1
        events.insert(at, {"type": "volume.workers", "workers": WORKERS})
    return events


def test_the_volume_report_names_its_pilot_approval_workers_and_pace(tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, Store(settings.db_path),
                           {"local": ScriptedDispatcher(_script)}, RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(tmp_path, extra=VOLUME)),
                         submitter="bob")
    service.start(sub.run_id)
    service.follow(sub.run_id, timeout=30)
    volume = service.decide(sub.run_id, "approve", "pilot clean", "alice")["volume_run"]
    service.follow(volume, timeout=30)

    page = parse(render_report(gather(service.store, volume)))
    decision = " ".join(page.sections["decisions"].split()).replace(" :", ":")
    assert "No decision yet" not in decision
    assert f"Launched by the approval of pilot {sub.run_id}: approve by alice" in decision
    assert "pilot clean" in decision
    engine = " ".join(page.sections["engine"].split())
    assert "2 on 1 node(s)" in engine and "per worker" in engine and "w1" in engine

    pilot_page = parse(render_report(gather(service.store, sub.run_id)))
    assert f"launched the volume run {volume}" in " ".join(
        pilot_page.sections["decisions"].split())


def test_the_engine_section_lists_stops_and_resumes_in_order() -> None:
    run = run_of(id="x-v1", name="x", kind="volume", status="finished")
    engine = {"workers": WORKERS, "items": 40, "work_s": 20.0,
              "attempts": [{"at": "2026-12-03T10:00:00Z", "resume": False},
                           {"at": "2026-12-03T10:05:00Z", "resume": True}],
              "stops": [{"at": "2026-12-03T10:02:00Z", "stage": "pilot"}], "stop": None}
    page = parse(render_report(ReportData(run=run, stages=[], decisions=[],
                                          generated_at="now", engine=engine)))
    text = " ".join(page.sections["engine"].split())
    assert text.index("started") < text.index("stopped") < text.index("resumed")
    assert "2 items/s in all, 1 items/s per worker" in text
