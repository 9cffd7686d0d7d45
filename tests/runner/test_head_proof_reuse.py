"""A volume head's card stages are taken from its card proof of this dispatch (issue 23).

The proof is a real ladder run (``--stages``-like table) in ``card-proof`` of the run dir,
as the dispatcher's card proof writes it; the head's ladder then runs with
``volume.head_proof`` naming it. The card stages record each call: a stage taken from the
proof is never called again.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from runner import events as ev
from runner.ladder import Ladder
from runner.spec import RunSpec, VolumeSpec
from runner.stage import StageContext, StageDef, StageFailure

CALLS: list[str] = []
FAIL_COMPUTE: list[bool] = []


def device(ctx: StageContext) -> dict[str, Any]:
    CALLS.append("device")
    return {"device": "cuda", "count": 8, "healthy_cards": [0, 1, 2, 3, 4, 5, 6, 7]}


def compute(ctx: StageContext) -> dict[str, Any]:
    CALLS.append("compute")
    if FAIL_COMPUTE:
        raise StageFailure("compute", "torch broke", error_type="RuntimeError")
    return {"healthy_cards": [0, 1, 2, 4, 5, 6, 7], "bf16_tflops": 910.0}


def interconnect(ctx: StageContext) -> dict[str, Any]:
    CALLS.append("interconnect")
    return {"healthy_cards": [0, 1, 2, 4, 5, 6, 7]}


def driver(ctx: StageContext) -> dict[str, Any]:
    CALLS.append("pilot")
    return {"ran_on": ctx.facts["interconnect"]["healthy_cards"]}


TABLE = [StageDef("device", f"{__name__}:device"),
         StageDef("compute", f"{__name__}:compute", ("device",)),
         StageDef("interconnect", f"{__name__}:interconnect", ("compute",))]


def run(spec: RunSpec, run_dir: Path, table: list[StageDef]) -> list[dict[str, Any]]:
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "events.jsonl"
    writer = ev.EventWriter(str(path), spec.run_id)
    try:
        finished = Ladder(spec, str(run_dir / "spec.json"), str(run_dir), False, writer,
                          table).run()
        writer.emit(ev.RUN_FINISHED, **finished)
    finally:
        writer.close()
    return [json.loads(line) for line in path.read_text().splitlines()]


def spec_of(tmp_path: Path, head_proof: dict[str, Any] | None, volume: bool = True,
            run_id: str = "v1") -> RunSpec:
    spec = RunSpec.from_dict({"run_id": run_id, "name": "vol",
                              "inputs": {"dir": str(tmp_path)}})
    if not volume:
        return spec
    return RunSpec(**{**spec.__dict__, "volume": VolumeSpec(gpus=True, head_proof=head_proof)})


def prove(tmp_path: Path) -> dict[str, Any]:
    """The card proof, as the dispatcher runs it, and what the head's spec names of it."""
    proof_dir = tmp_path / "run" / "card-proof"
    events = run(spec_of(tmp_path, None), proof_dir, TABLE)
    finished = [e for e in events if e["type"] == ev.RUN_FINISHED][-1]
    CALLS.clear()
    return {"dir": str(proof_dir), "run": "v1", "finished_at": finished["ts"]}


def outcome(events: list[dict[str, Any]], stage: str) -> dict[str, Any]:
    return [e for e in events if e.get("stage") == stage and e["type"] != "stage.started"][-1]


def head(tmp_path: Path, spec: RunSpec) -> list[dict[str, Any]]:
    return run(spec, tmp_path / "run", TABLE + [
        StageDef("pilot", f"{__name__}:driver", ("interconnect",))])


def test_the_head_takes_the_card_stages_its_proof_passed_without_running_them(
        tmp_path: Path) -> None:
    CALLS.clear()
    FAIL_COMPUTE.clear()
    proof = prove(tmp_path)
    events = head(tmp_path, spec_of(tmp_path, proof))
    assert CALLS == ["pilot"]  # no card stage ran again
    for stage in ("device", "compute", "interconnect"):
        event = outcome(events, stage)
        assert event["type"] == "stage.passed"
        assert event["facts"]["proven_by"] == {"card_proof": proof["dir"],
                                               "at": proof["finished_at"]}
        assert [e for e in events if e.get("stage") == stage][0]["type"] == "stage.started"
    assert outcome(events, "compute")["facts"]["bf16_tflops"] == 910.0  # the proof's facts
    assert outcome(events, "pilot")["facts"]["ran_on"] == [0, 1, 2, 4, 5, 6, 7]
    recorded = json.loads((tmp_path / "run" / "environment.json").read_text())["stages"]
    assert recorded["interconnect"]["status"] == "passed"
    assert "proven_by" in recorded["interconnect"]["facts"]


def test_a_pilot_runs_its_card_stages(tmp_path: Path) -> None:
    CALLS.clear()
    FAIL_COMPUTE.clear()
    prove(tmp_path)
    events = head(tmp_path, spec_of(tmp_path, None, volume=False))
    assert CALLS == ["device", "compute", "interconnect", "pilot"]
    assert "proven_by" not in outcome(events, "device")["facts"]


def test_a_proof_of_another_attempt_or_run_or_node_is_not_taken(tmp_path: Path) -> None:
    CALLS.clear()
    FAIL_COMPUTE.clear()
    proof = prove(tmp_path)
    for other in ({**proof, "finished_at": "2026-01-01T00:00:00.000Z"},  # an earlier proof
                  {**proof, "run": "v0"},  # another run's
                  {**proof, "dir": str(tmp_path / "elsewhere")}):  # not on this node
        events = head(tmp_path, spec_of(tmp_path, other))
        assert CALLS == ["device", "compute", "interconnect", "pilot"], other
        assert "proven_by" not in outcome(events, "device")["facts"]
        CALLS.clear()


def test_a_stage_the_proof_did_not_pass_runs_again(tmp_path: Path) -> None:
    CALLS.clear()
    FAIL_COMPUTE[:] = [True]
    proof = prove(tmp_path)
    FAIL_COMPUTE.clear()
    events = head(tmp_path, spec_of(tmp_path, proof))
    # the proof's compute failed (and so its interconnect was skipped): both run here
    assert CALLS == ["compute", "interconnect", "pilot"]
    assert "proven_by" in outcome(events, "device")["facts"]
    assert "proven_by" not in outcome(events, "compute")["facts"]
