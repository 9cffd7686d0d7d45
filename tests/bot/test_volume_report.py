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
    service.starter.start(sub.run_id)
    service.follower.follow(sub.run_id, timeout=30)
    volume = service.decider.decide(sub.run_id, "approve", "pilot clean", "alice")["volume_run"]
    service.follower.follow(volume, timeout=30)

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


# Two rented nodes whose images both say "ubuntu": told apart by the manifest's address,
# counted by Ray's node id (issue 37, point 4).
TWO_NODES = [{"worker": f"w{k}@{where}[cpu]", "node": node, "host": "ubuntu", "where": where,
              "cards": []} for k, (node, where) in enumerate(
                  [("n0", "root@gpu-a:22"), ("n0", "root@gpu-a:22"),
                   ("n1", "root@gpu-b:22"), ("n1", "root@gpu-b:22")])]


def _two_node_script(run_id: str) -> list[dict[str, Any]]:
    events = pilot_script(IDS, refuse=())
    if run_id.endswith("-v1"):
        at = events.index({"type": "stage.started", "stage": "pilot"}) + 1
        events[at:at] = [
            {"type": "volume.workers", "workers": TWO_NODES},
            {"type": "volume.card_excluded", "worker": "w1@root@gpu-a:22[cpu]", "cards": [],
             "reason": "batch 3 out for more than 60 s; the worker is stopped"},
            {"type": "volume.split", "batch": 3, "items": 8, "cause": "late",
             "worker": "w1@root@gpu-a:22[cpu]", "reason": "held past 60 s", "parts": [9, 10],
             "refused": []},
            {"type": "volume.split", "batch": 12, "items": 1, "cause": "timeout",
             "worker": "w2@root@gpu-b:22[cpu]", "reason": "no result", "parts": [],
             "refused": [{"id": "doc-03", "reason": "timeout: no result within "
                                                   "task.item_timeout_s = 5 s"}]}]
    return events


def test_the_engine_section_names_nodes_by_address_and_tells_what_the_terminal_told(
        tmp_path: Path) -> None:
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    service = PilotService(settings, Store(settings.db_path),
                           {"local": ScriptedDispatcher(_two_node_script)}, RecordingNotifier())
    sub = service.submit(load_manifest_file(write_manifest(tmp_path, extra=VOLUME)),
                         submitter="bob")
    service.starter.start(sub.run_id)
    service.follower.follow(sub.run_id, timeout=30)
    volume = service.decider.decide(sub.run_id, "approve", "pilot clean", "alice")["volume_run"]
    service.follower.follow(volume, timeout=30)
    engine = " ".join(parse(render_report(gather(service.store, volume))).sections[
        "engine"].split())
    assert "4 on 2 node(s)" in engine
    assert engine.count("root@gpu-b:22") >= 2 and "ubuntu" not in engine
    assert "worker w1@root@gpu-a:22[cpu] excluded: batch 3 out for more than 60 s" in engine
    assert "batch 3 (8 items) split in 2 (late: held past 60 s)" in engine
    assert "input doc-03 refused: timeout: no result within task.item_timeout_s = 5 s" in engine
