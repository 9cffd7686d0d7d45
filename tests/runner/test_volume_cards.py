"""A volume goes on with the healthy cards: the card stages of a volume's own run.

The pilot failed on a card (``CardFault``) and was approved with an override to continue
on the healthy cards. The volume's run proves its node again with the same stages; a card
verdict there must exclude the card, not fail the ``device`` stage and skip the driver.
Run through the real stage ladder, in this process, with stage functions of this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner import events as ev
from runner.cards import tolerate_card_verdict
from runner.ladder import Ladder
from runner.spec import RunSpec, VolumeSpec
from runner.stage import StageContext, StageDef, StageFailure

HEALTHY = [0, 1, 2, 4, 5, 6, 7]


def faulty_device(ctx: StageContext) -> dict[str, Any]:
    raise StageFailure("device", "GPU 3 (0000:9b:00.0): 2 volatile uncorrected ECC error(s)",
                       error_type="CardFault", hint="replace the node",
                       facts={"device": "cuda", "healthy_cards": HEALTHY, "warnings": []})


def no_healthy_card(ctx: StageContext) -> dict[str, Any]:
    raise StageFailure("device", "every card has ECC errors", error_type="CardFault",
                       facts={"device": "cuda", "healthy_cards": [], "warnings": []})


def driver(ctx: StageContext) -> dict[str, Any]:
    return {"ran_on": ctx.facts["device"]["healthy_cards"]}


def run_ladder(tmp_path: Path, device: str, *, volume: bool) -> list[dict[str, Any]]:
    spec = RunSpec.from_dict({"run_id": "v1", "name": "vol", "inputs": {"dir": str(tmp_path)}})
    if volume:
        spec = RunSpec(**{**spec.__dict__, "volume": VolumeSpec(gpus=True)})
    table = [StageDef("device", f"{__name__}:{device}"),
             StageDef("pilot", f"{__name__}:driver", ("device",))]
    path = tmp_path / "events.jsonl"
    writer = ev.EventWriter(str(path), "v1")
    try:
        Ladder(spec, str(tmp_path / "spec.json"), str(tmp_path), False, writer, table).run()
    finally:
        writer.close()
    return [json.loads(line) for line in path.read_text().splitlines()]


def outcome(events: list[dict[str, Any]], stage: str) -> dict[str, Any]:
    return [e for e in events if e.get("stage") == stage and e["type"] != "stage.started"][-1]


def test_a_volume_s_device_stage_excludes_the_faulty_card_and_its_driver_runs(
        tmp_path: Path) -> None:
    events = run_ladder(tmp_path, "faulty_device", volume=True)
    device = outcome(events, "device")
    assert device["type"] == "stage.passed"
    assert device["facts"]["card_verdict"]["type"] == "CardFault"
    assert device["facts"]["healthy_cards"] == HEALTHY
    assert "the volume goes on with the healthy card(s) 0, 1, 2, 4, 5, 6, 7" in \
        device["facts"]["warnings"][-1]
    pilot = outcome(events, "pilot")
    assert pilot["type"] == "stage.passed" and pilot["facts"]["ran_on"] == HEALTHY


def test_a_pilot_still_fails_on_a_faulty_card(tmp_path: Path) -> None:
    events = run_ladder(tmp_path, "faulty_device", volume=False)
    assert outcome(events, "device")["error"]["type"] == "CardFault"
    assert outcome(events, "pilot")["type"] == "stage.skipped"


def test_a_volume_with_no_healthy_card_left_still_fails(tmp_path: Path) -> None:
    events = run_ladder(tmp_path, "no_healthy_card", volume=True)
    assert outcome(events, "device")["type"] == "stage.failed"
    assert outcome(events, "pilot")["reason"] == "device failed"


def test_only_card_verdicts_of_card_stages_are_tolerated() -> None:
    spec = RunSpec.from_dict({"run_id": "v1", "name": "vol", "inputs": {"dir": "."},
                              "volume": {"gpus": True}})
    failed = {"status": "failed", "facts": {"healthy_cards": [0]},
              "error": {"type": "TooFewDevices", "message": "7 of 8"}}
    assert tolerate_card_verdict(spec, "device", failed) is failed
    slow = {**failed, "error": {"type": "SlowCard", "message": "slow"}}
    assert tolerate_card_verdict(spec, "compute", slow)["status"] == "passed"
    assert tolerate_card_verdict(spec, "memory", slow) is slow
