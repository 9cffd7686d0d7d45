"""The volume's time limit and batch timeout: decided from the forecast or the manifest,
shown before approval, checked against the lease, carried in the volume's spec."""

from __future__ import annotations

import json
import math
from datetime import datetime, timedelta, timezone
from pathlib import Path

from bot.pilot.forecast import duration
from bot.pilot.volume_limits import volume_limits
from tests.bot.test_forecast_service import finished_pilot, texts

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=timezone.utc)
FORECAST = {"possible": True, "high_s": 36000.0, "low_s": 30000.0, "p90_s": 9.0}


def _manifest(**volume: object) -> dict[str, object]:
    return {"task": {"batch_size": 8}, "volume": {"inputs": {"dir": "x"}, **volume}}


def test_the_time_limit_is_twice_the_forecast_s_high_estimate_plus_the_setup() -> None:
    limits = volume_limits(_manifest(batch_size=10), {}, FORECAST, NOW)
    assert limits is not None
    assert limits.time_limit_s == 2 * 36000 + 1800  # ten hours forecast: 20.5 h, not 1 h
    assert limits.time_why == "2 × the forecast's high estimate 10 h 0 min 0 s + 30 min 0 s " \
                              "for the setup"
    # the first batches may take ten times the pilot's: 9 s p90 × 10 items = 90 s -> 900 s;
    # the item clock of a batch (10 × 90 s) + 10 s comes later: the batch timeout waits
    assert limits.pilot_batch_s == 90.0 and limits.batch_timeout_s == 0
    assert limits.item_timeout_s == 90.0  # 10 × the pilot's 9 s p90 (task's unset)
    assert limits.rows()[2] == ("Batch timeout", "15 min 10 s", limits.batch_why)
    assert limits.in_flight == 2
    assert volume_limits({"task": {}}, {}, FORECAST, NOW) is None


def test_the_manifest_sets_both_and_a_short_limit_is_said_before_approval() -> None:
    limits = volume_limits(_manifest(time_limit_s=7200, batch_timeout_s=300, in_flight=3),
                           {}, FORECAST, NOW)
    assert limits is not None
    assert (limits.time_limit_s, limits.time_why) == (7200, "volume.time_limit_s")
    assert (limits.batch_timeout_s, limits.batch_why) == (300, "volume.batch_timeout_s")
    assert limits.in_flight == 3
    assert limits.notes and "shorter than the forecast's high estimate" in limits.notes[0]


def test_without_a_forecast_a_day_and_never_past_the_lease() -> None:
    limits = volume_limits(_manifest(), {"ends_at": (NOW + timedelta(hours=5)).isoformat()},
                           {"possible": False, "reason": "no per-item time"}, NOW)
    assert limits is not None
    assert limits.time_limit_s == 5 * 3600
    assert limits.time_why == "no forecast and no volume.time_limit_s: one day, cut to the " \
                              "lease's end"
    assert "would end after the lease" in limits.notes[0]
    assert limits.pilot_batch_s == 0 and "no per-item time" in limits.batch_why


def test_the_approved_volume_s_spec_carries_the_limits_shown_in_the_forecast(
        tmp_path: Path) -> None:
    service, notifier, run_id = finished_pilot(
        tmp_path, datetime.now(timezone.utc) - timedelta(hours=1))
    fc = service.store.get_run(run_id)["forecast"]
    shown = texts(notifier.latest[(run_id, "forecast")])
    high = float(fc["high_s"])  # seconds, from the pilot's 0.5 s per item
    limit = math.ceil(2 * high + 1800)
    assert f"Volume time limit | {duration(limit)} | 2 × the forecast's high estimate " \
           f"{duration(high)} + 30 min 0 s for the setup" in shown
    assert "Batch timeout | 1 min 0 s | 10 × the slowest batch, at least 60 s" in shown
    assert "Item timeout | 5 s | 10 × the pilot's 0.5 s p90 per item, at least 5 s" in shown
    volume_id = service.decider.decide(run_id, "approve", "go", "alice")["volume_run"]
    spec = json.loads(Path(service.store.get_run(volume_id)["spec_path"]).read_text())
    assert spec["volume"]["time_limit_s"] == limit
    size = spec["volume"]["batch_size"] or spec["task"]["batch_size"]
    assert spec["volume"]["pilot_batch_s"] == 0.5 * size
    assert spec["volume"]["batch_timeout_s"] == 0 and spec["volume"]["in_flight"] == 2
    assert spec["task"]["item_timeout_s"] == 5.0  # derived from the pilot, not 300 s
    pilot = json.loads(Path(service.store.get_run(run_id)["spec_path"]).read_text())
    assert pilot["task"]["item_timeout_s"] == 300.0  # the pilot's own default


def test_by_default_a_hung_input_is_interrupted_before_its_worker_is_stopped() -> None:
    """task.item_timeout_s unset: the volume's item timeout comes from the pilot (10 × its
    p90, at least 5 s), and the batch timeout never comes before a batch's item clock;
    the manifest's own values are kept, a batch timeout shorter than the clock said
    (issue 37, point 5)."""
    quick = {"possible": True, "high_s": 60.0, "low_s": 50.0, "p90_s": 0.02}
    limits = volume_limits(_manifest(batch_size=16), {}, quick, NOW)
    assert limits is not None
    assert limits.item_timeout_s == 5.0 and "at least 5 s" in limits.item_why
    # a batch of 16: one item 5 s, each other 10 × 0.02 s: 8 s, well within 60 s
    assert limits.item_clock_s() == 8.0 and limits.first_batch_timeout_s() == 60.0
    rows = {label: (value, why) for label, value, why in limits.rows()}
    assert rows["Item timeout"][0] == "5 s" and "interrupted on its worker after 8 s" in \
        rows["Item timeout"][1]
    assert rows["Batch timeout"][0] == "1 min 0 s"
    assert "never before the batch's item clock (8 s) + 10 s" in rows["Batch timeout"][1]
    given = volume_limits({"task": {"batch_size": 8, "item_timeout_s": 30},
                           "volume": {"inputs": {"dir": "x"}, "batch_timeout_s": 20}},
                          {}, quick, NOW)
    assert given is not None and (given.item_timeout_s, given.item_why) == (
        30.0, "task.item_timeout_s")
    assert any("shorter than a batch's item clock (31.4 s)" in n for n in given.notes)
