"""What the forecast reads from a run (bot/service/forecast_inputs.py): the pilot's items as timed
measurements, its setup, and after the volume the attempts' running time against it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from typing import Any

import pytest

from bot.pilot.forecast import ItemOutcome
from bot.service.forecast_inputs import (
    attempt_seconds,
    check_volume,
    measured_setup,
    pilot_node,
    samples,
)
from runner.events import Event
from tests.bot.runs import run_of

T0 = datetime(2026, 12, 1, 8, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat().replace("+00:00", "Z")


def outcome(n: int, seconds: float | None, status: str = "accepted") -> ItemOutcome:
    return ItemOutcome(f"doc-{n:02d}", status, at(n), seconds, 100 * n)


def test_a_batchs_items_are_one_measurement() -> None:
    """A handler's batch of 4 timed as a whole: each item carries the batch's time ÷ 4;
    the refused item of a batch belongs to it too; the next batch starts a new one even
    with the same share, after 4 items."""
    items = [outcome(1, 0.25), outcome(2, 0.25, "refused"), outcome(3, 0.25), outcome(4, 0.25),
             outcome(5, 0.25), outcome(6, 0.25), outcome(7, 0.3), outcome(8, None),
             outcome(9, 0.3)]
    got = samples(items, batch_size=4)
    assert [(s.seconds, s.batch) for s in got] == [
        (0.25, 0), (0.25, 0), (0.25, 0), (0.25, 1), (0.25, 1), (0.3, 2), (0.3, 3)]
    assert got[0].input_bytes == 100
    # items timed on their own (a batch of one, a command's own figures): no batch
    assert {s.batch for s in samples(items, batch_size=1)} == {None}


def test_the_pilots_setup_is_read_from_its_stages_and_its_dispatch() -> None:
    stages = [{"stage": name, "started_at": at(start), "ended_at": at(end)}
              for name, start, end in (("prepare", 2, 3), ("interpreter", 3, 3.5),
                                       ("torch", 3.5, 5), ("device", 5, 6), ("memory", 6, 8),
                                       ("pilot", 8, 20), ("balance", 20, 21))]
    run = run_of(started_at=at(0))
    setup = measured_setup(run, stages, runner_started=at(1.5), node={"kind": "ssh"})
    assert setup.diagnostics_s == 6.0          # every stage before the pilot's
    assert setup.proof_s == 4.0                # the card proof's stages (not memory)
    assert setup.dispatch_s == 1.5 and setup.ssh
    nothing = measured_setup(run_of(), [], None, {})
    assert (nothing.diagnostics_s, nothing.dispatch_s, nothing.ssh) == (None, None, False)


def test_which_of_the_volumes_nodes_the_pilot_proved() -> None:
    a, b = {"kind": "ssh", "host": "GPU-A", "port": 22}, {"kind": "ssh", "host": "gpu-b"}
    assert pilot_node({"kind": "local"}, None) == 0
    assert pilot_node({"kind": "ssh", "host": "gpu-b"}, [a, b]) == 1
    assert pilot_node({"kind": "ssh", "host": "gpu-a"}, [a, b]) == 0
    assert pilot_node({"kind": "ssh", "host": "gpu-c"}, [a, b]) is None


def event(seq: int, etype: str, seconds: float, **data: Any) -> Event:
    return Event(seq, etype, "vol", at(seconds), data)


def attempt(seq: int, start: float, work: float, end: str | None = "stage.passed",
            done: int = 0) -> list[Event]:
    """One attempt: the runner starts, diagnostics, the pilot stage runs ``work`` s."""
    out = [event(seq, "run.started", start), event(seq + 1, "stage.started", start + 5,
                                                   stage="pilot"),
           event(seq + 2, "progress", start + 5 + work, done=done, total=1000)]
    if end:
        out.append(event(seq + 3, end, start + 5 + work, stage="pilot"))
    return out


FORECAST = {"possible": True, "volume_count": 1000, "ray_start_s": 4.6, "proc_low_s": 80.0,
            "proc_mid_s": 100.0, "proc_high_s": 125.0, "low_s": 90.0, "high_s": 140.0}


def test_actual_counts_the_attempts_running_time_not_the_days_between() -> None:
    """A driver killed after 1 h (no stage end: its last event counts), resumed two days
    later for 1 h more: 2 h of work, not 2 days. The forecast for the whole volume: two
    Ray starts and the processing."""
    events = attempt(1, 0, 3600, end=None, done=500) + attempt(10, 2 * 86400, 3600, done=1000)
    events.insert(5, event(14, "volume.workers", 2 * 86400 + 6, workers=[{"worker": "w0"}] * 3))
    assert attempt_seconds(events) == [3600.0, 3600.0]
    check = check_volume(run_of(), [], {**FORECAST, "workers": 4}, events, done=1000)
    assert check is not None
    assert (check["workers_started"], check["workers_forecast"]) == (3, 4)
    # the second attempt's Ray and workers were up 1 s into its work stage
    assert check["ray_start_measured_s"] == [1.0]
    assert check["formula"].endswith("Ray and its workers took 1 s to start (forecast 4.6 s "
                                     "each)")
    assert check["actual_s"] == 7200.0 and check["attempts"] == 2
    assert check["scored"] == "whole" and check["forecast_mid_s"] == 2 * 4.6 + 100.0
    assert check["error_pct"] == round((7200 - 109.2) / 109.2 * 100, 1)
    assert check["formula"].startswith("actual 3.6e+03 s + 3.6e+03 s = 7.2e+03 s (2 attempts)")


def test_a_stopped_attempt_is_scored_on_the_items_it_ran() -> None:
    """Stopped after 300 of 1,000 items in 35 s: the forecast for those 300 items is one Ray
    start + 30 % of the processing, not the whole volume's."""
    events = attempt(1, 0, 35, end="stage.failed", done=300)
    check = check_volume(run_of(), [], FORECAST, events, done=300)
    assert check is not None
    assert check["scored"] == "partial" and check["items_done"] == 300
    assert check["forecast_low_s"] == pytest.approx(4.6 + 24.0)
    assert check["forecast_mid_s"] == pytest.approx(4.6 + 30.0)
    assert check["forecast_high_s"] == pytest.approx(4.6 + 37.5)
    assert check["within_range"] and check["error_pct"] == round((35 - 34.6) / 34.6 * 100, 1)
    assert "the 300 of 1,000 items its attempts recorded" in check["formula"]


def test_without_events_the_stage_row_is_one_attempt() -> None:
    stages = [{"stage": "pilot", "started_at": at(0), "ended_at": at(110)}]
    check = check_volume(run_of(), stages, FORECAST)
    assert check is not None and check["actual_s"] == 110.0 and check["attempts"] == 1
    assert check_volume(run_of(), stages, {"possible": False}) is None
