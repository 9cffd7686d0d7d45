"""The forecast from the volume's calibration (bot/pilot/calibration.py, forecast_model.py):
every phase beside its formula, the range from the batch-to-batch spread."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal
from typing import Any

import pytest

from bot.pilot.calibration import Calibration, Measured, calibration_of
from bot.pilot.forecast import RAY_HIGH, RAY_LOW, ForecastInputs, Sample, forecast
from bot.pilot.forecast_stats import t95

NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=timezone.utc)
TIMES = (0.50, 0.52, 0.48, 0.51, 0.49, 0.50)          # six batches of 16, seconds each


def cal(**kw: Any) -> Calibration:
    base = Calibration(batch_size=16, workers=2,
                       batches=tuple(Measured(16, 16_000, t) for t in TIMES),
                       warmup=(Measured(16, 16_000, 2.5), Measured(16, 16_000, 2.4)),
                       record=tuple(Measured(16, 0, 0.0016) for _ in range(8)),
                       ray_start_s=3.0, workers_ready_s=4.0, ray_stop_s=1.0,
                       output_files=0, output_bytes=0, recorded=128,
                       sample_ids=tuple(f"v{k}" for k in range(96)), sample_total=96,
                       warmup_ids=tuple(f"w{k}" for k in range(32)), listed=10_000,
                       seconds=12.0)
    return replace(base, **kw)


def inputs(**kw: Any) -> ForecastInputs:
    base = ForecastInputs(samples=(), accepted=12, volume_count=10_000,
                          volume_bytes=10_000_000, rented_cards=1, cards_per_lot=1, lots=1,
                          days=1, lot_price_usd_per_day=Decimal("24.00"), now=NOW, gpus=False,
                          cores=2, batch_size=16, calibration=cal())
    return replace(base, **kw)


def test_the_processing_is_the_calibrated_batches_over_the_workers_with_a_t_range() -> None:
    fc = forecast(inputs())
    assert fc.possible, fc.reason
    n = fc.numbers
    t = statistics.fmean(TIMES)
    sd = max(statistics.stdev(TIMES), 0.05 * t)          # never under 5 % of the batch time
    batches = 10_000 / 16
    compute = batches * t / 2 + 0.5 * t                 # + half a batch: the last round
    spread = batches * sd * math.sqrt(1 / 6 + 1 / batches) / 2
    z = t95(5)
    warm = 2.5 - t                                       # the largest first-call extra
    assert n["calibrated"] is True and n["workers"] == 2
    assert n["compute_s"] == pytest.approx(compute, abs=1e-3)
    assert n["warmup_s"] == pytest.approx(warm, abs=1e-3)
    assert n["proc_mid_s"] == pytest.approx(warm + compute, abs=1e-3)
    assert n["proc_low_s"] == pytest.approx(warm + compute - z * spread, abs=1e-3)
    assert n["proc_high_s"] == pytest.approx(warm + compute + z * spread + t, abs=1e-3)
    assert n["proc_high_s"] / n["proc_low_s"] < 1.2
    # Ray: measured on the pilot's node (start with the handler loaded + stop), its range
    assert n["ray_start_s"] == 5.0
    assert (n["ray_start_low_s"], n["ray_start_high_s"]) == (5.0 * RAY_LOW, 5.0 * RAY_HIGH)
    assert "measured on the pilot's node by the calibration" in fc.figure("setup_ray").formula
    # each phase beside its formula
    assert "Student's t, 5 df" in fc.figure("items").formula
    assert "timed apart (2.5 s, 2.4 s)" in fc.figure("warmup").formula
    assert "10,000 items × 0.1 ms per item" in fc.figure("recording").formula
    calibration = fc.figure("calibration")
    assert calibration.value.startswith("6 batches of 16, 12 s, ")
    assert "v0, v1" in calibration.formula and "and 86 more" in calibration.formula
    assert not any("rests on the pilot alone" in note for note in fc.notes)


def test_a_driver_bound_volume_is_never_faster_than_the_driver_records() -> None:
    slow_driver = cal(record=tuple(Measured(16, 0, 0.48) for _ in range(8)))  # 30 ms/item
    fc = forecast(inputs(calibration=slow_driver))
    n = fc.numbers
    assert n["recording_bound"] is True
    assert n["recording_s"] == pytest.approx(300.0)
    assert n["proc_mid_s"] == pytest.approx(n["warmup_s"] + 300.0, abs=1e-3)
    assert any("more workers would not make the volume faster" in note for note in fc.notes)


def test_batch_time_follows_the_batches_bytes_at_the_volume_mean() -> None:
    # time = 0.1 s + 1 s per MB; batches of 0.2 to 0.6 MB; the volume's mean batch 0.8 MB
    sizes = (200_000, 300_000, 400_000, 500_000, 600_000, 350_000)
    by_size = cal(batches=tuple(Measured(16, b, 0.1 + b / 1e6) for b in sizes))
    fc = forecast(inputs(calibration=by_size, volume_bytes=10_000 * 50_000))
    n = fc.numbers
    assert n["batch_fit"]["r2"] == pytest.approx(1.0)
    assert n["batch_s"] == pytest.approx(0.1 + 0.8, rel=1e-6)
    assert "at the volume's mean batch of 800,000 B" in fc.figure("batch").formula


def test_failed_calibration_calls_add_their_rework() -> None:
    fc = forecast(inputs(calibration=cal(failed_batches=2, errors=("task.handler raised",))))
    assert fc.numbers["rework_s"] > 0
    assert "2 of 10 calibration calls failed" in fc.figure("rework").formula
    assert any("failed on the volume's inputs" in note for note in fc.notes)


@pytest.mark.parametrize("calibration, calibrate, why", [
    (None, False, "volume.calibrate is false"),
    (Calibration(skipped="skipped: the volume's inputs cannot be listed on this node"), True,
     "the calibration skipped: the volume's inputs cannot be listed"),
    (cal(batches=(Measured(16, 1, 0.5),)), True, "timed only 1 batch"),
])
def test_without_a_usable_calibration_the_forecast_says_it_rests_on_the_pilot(
        calibration: Calibration | None, calibrate: bool, why: str) -> None:
    samples = tuple(Sample(0.03, 1000, batch=k // 4) for k in range(12))
    fc = forecast(inputs(samples=samples, calibration=calibration, calibrate=calibrate))
    assert fc.possible and fc.numbers["calibrated"] is False
    assert any("rests on the pilot alone" in note and why in note for note in fc.notes)
    measured = calibration is not None and calibration.skipped is None  # Ray's start still
    assert ("by the calibration" if measured else "embedded default") in \
        fc.figure("setup_ray").formula


def test_the_stage_row_from_the_node_is_checked_before_it_is_trusted() -> None:
    row = {"stage": "calibrate", "state": "passed",
           "started_at": "2026-12-03T12:00:00+00:00", "ended_at": "2026-12-03T12:00:15+00:00",
           "facts": {"batch_size": 16, "workers": "two", "ray_start_s": -1,
                     "workers_ready_s": 4.5, "batches": [
                         {"items": 16, "bytes": 10, "seconds": 0.5}, "junk",
                         {"items": 16, "seconds": "slow"}, {"items": -2, "seconds": 0.1}],
                     "sample_ids": ["a", 3, None], "sample_ids_total": 500}}
    got = calibration_of([row])
    assert got is not None and got.skipped is None
    assert got.batches == (Measured(16, 10, 0.5),) and got.workers == 0
    assert got.ray_start_s is None and got.workers_ready_s == 4.5
    assert got.sample_ids == ("a", "3") and got.sample_total == 500 and got.seconds == 15.0
    skipped = calibration_of([{"stage": "calibrate", "state": "skipped", "reason": "ray"}])
    assert skipped is not None and skipped.skipped == "skipped: ray"
    assert calibration_of([{"stage": "pilot", "state": "passed"}]) is None


def test_the_thread_says_when_the_volume_time_limit_widened() -> None:
    from bot.messages.volume_view import NOTE_TYPES, note
    from runner.events import VOLUME_LIMIT, Event

    assert VOLUME_LIMIT in NOTE_TYPES
    event = Event(seq=9, type=VOLUME_LIMIT, run="v1", ts="2026-12-03T12:00:00+00:00",
                  data={"limit_s": 4920.0, "was_s": 600.0, "items_per_s": 3.33,
                        "projected_s": 3000.0, "lease_cut": False})
    line = note(event)
    assert line is not None and line.style == "warn"
    assert line.text == ("the items run slower than forecast (3.33 items/s, about 50 min for "
                         "the work stage): its time limit widened from 10 min to 82 min, "
                         "within the lease")


def test_a_limit_from_the_forecast_adapts_and_one_the_manifest_set_does_not() -> None:
    from bot.pilot.volume_limits import volume_limits

    manifest: dict[str, Any] = {"volume": {"inputs": {}}, "task": {"batch_size": 4}}
    fc = {"possible": True, "high_s": 100.0, "p90_s": 0.1,
          "lease_end": "2026-12-05T00:00:00+00:00"}
    derived = volume_limits(manifest, {}, fc, NOW)
    assert derived is not None and derived.adapts
    assert derived.lease_ends_at == datetime(2026, 12, 5, tzinfo=timezone.utc).timestamp()
    assert "widened while the volume runs" in derived.rows()[0][2]
    manifest["volume"]["time_limit_s"] = 50
    given = volume_limits(manifest, {}, fc, NOW)
    assert given is not None and not given.adapts


def test_the_pilot_thread_shows_the_calibration_its_ids_time_and_cost(tmp_path: Any) -> None:
    """Through the service: the calibrate stage's facts (as the node reports them) make the
    forecast, and the thread's forecast names the sample, its time and its cost."""
    from tests.bot.fakes import pilot_script
    from tests.bot.test_forecast_service import IDS, VOLUME, texts
    from tests.bot.test_service import make, submit

    facts = {"batch_size": 16, "workers": 2, "listed": 6, "sample_ids": ["doc-01", "doc-02"],
             "warmup_ids": ["doc-03"], "workers_ready_s": 3.0, "ray_stop_s": 1.0,
             "batches": [{"items": 16, "bytes": 480, "seconds": t} for t in TIMES],
             "warmup": [{"items": 16, "bytes": 480, "seconds": 1.5}],
             "record": [{"items": 16, "seconds": 0.002}] * 6, "record_items": 96}

    def script(run: Any) -> list[dict[str, Any]]:
        out = pilot_script(IDS, refuse=())
        at = next(k for k, e in enumerate(out) if e.get("stage") == "evidence")
        out[at:at] = [{"type": "stage.started", "stage": "calibrate"},
                      {"type": "stage.passed", "stage": "calibrate", "facts": facts}]
        return out

    service, _notifier = make(tmp_path, script)
    run_id = submit(service, tmp_path, count=6, extra=VOLUME)
    service.follower.follow(run_id, timeout=30)
    fc = service.store.get_run(run_id)["forecast"]
    assert fc["possible"] and fc["calibrated"] is True and fc["ray_start_s"] == 4.0
    thread = {m.key: m for m in service.publisher.thread_messages(run_id)}
    shown = texts(thread["forecast"])
    assert "Calibration (the volume's own inputs) | 6 batches of 16" in shown
    assert "sample: doc-01, doc-02" in shown and "not counted in the volume" in shown
    assert "rests on the pilot alone" not in shown
    from bot.messages.model import StageLine

    lines = {b.stage: b.state for b in thread["status"].blocks if isinstance(b, StageLine)}
    assert lines["calibrate"] == "passed" and lines["balance"] == "passed"


def test_a_tiny_handler_is_held_to_the_pace_its_batches_came_back_through_one_driver() -> None:
    tiny = cal(batches=tuple(Measured(16, 16_000, 0.0015) for _ in range(30)),
               warmup=(), timed_wall_s=0.075)                    # 2.5 ms a batch, all told
    fc = forecast(inputs(calibration=tiny))
    n = fc.numbers
    assert n["compute_s"] < 1.0                                  # the workers' own time
    assert n["proc_mid_s"] == pytest.approx(10_000 / 16 * 0.0025, rel=1e-3)
    assert "never faster than the driver hands out and collects" in \
        fc.figure("pace").formula
    assert any("more workers would not make the volume faster" in note for note in fc.notes)


def test_the_volume_drivers_own_pace_comes_before_the_calibrations_loop() -> None:
    tiny = cal(batches=tuple(Measured(16, 16_000, 0.0015) for _ in range(30)),
               warmup=(), timed_wall_s=0.075, pace=(60, 0.24))     # 4 ms a batch
    fc = forecast(inputs(calibration=tiny))
    assert fc.numbers["proc_mid_s"] == pytest.approx(10_000 / 16 * 0.004, rel=1e-3)
    assert "through the volume's own driver" in fc.figure("pace").formula
