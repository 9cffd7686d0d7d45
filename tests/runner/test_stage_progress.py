"""A stage judged by its progress (the evidence stage, issue 35): it runs as long as it
moves, and fails once it stops moving, naming where it stopped."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runner import events as ev
from runner.ladder import Ladder
from runner.spec import RunSpec
from runner.stage import STAGES_BY_NAME, StageContext

STOP = threading.Event()


def moving(ctx: StageContext) -> dict[str, int]:
    """Beats every 20 ms for three times its 1 s window, then ends."""
    end, beats = time.monotonic() + 3.0, 0
    while time.monotonic() < end:
        ctx.beat(f"member {beats}")
        beats += 1
        STOP.wait(0.02)
    return {"beats": beats}


def stuck(ctx: StageContext) -> dict[str, int]:
    """Moves a little, then hangs (a stuck write on a mount) until the test ends."""
    ctx.beat("shards/outputs-000000.tar (outputs/a.json)")
    ctx.beat("shards/outputs-000003.tar (outputs/doc-7.json)")
    STOP.wait(60)
    return {}


@pytest.fixture
def ladder(tmp_path: Path) -> Iterator[Ladder]:
    spec = RunSpec.from_dict({"run_id": "r", "name": "p", "inputs": {"dir": str(tmp_path)}})
    writer = ev.EventWriter(str(tmp_path / "events.jsonl"), "r")
    yield Ladder(spec, str(tmp_path / "spec.json"), str(tmp_path), False, writer)
    writer.close()


def test_a_stage_that_keeps_moving_outlives_its_window(ladder: Ladder) -> None:
    result = ladder._run_in_thread(
        "evidence", 1.0, "tests.runner.test_stage_progress:moving", idle=True)
    assert result["status"] == "passed", result
    assert result["facts"]["beats"] > 10


def test_a_stage_that_stops_moving_fails_naming_where(ladder: Ladder) -> None:
    try:
        result = ladder._run_in_thread(
            "evidence", 1.0, "tests.runner.test_stage_progress:stuck", idle=True)
    finally:
        STOP.set()
    error = result["error"]
    assert result["status"] == "failed" and error["type"] == "Timeout"
    assert error["message"] == ("stage evidence made no progress for 1 s; it stopped at "
                                "shards/outputs-000003.tar (outputs/doc-7.json)")
    assert "diagnostics.timeouts.evidence" in error["hint"]
    assert result["facts"]["stalled_at"] == "shards/outputs-000003.tar (outputs/doc-7.json)"


def test_the_evidence_stage_is_judged_by_progress() -> None:
    stage = STAGES_BY_NAME["evidence"]
    assert stage.idle and stage.timeout_s == 300
