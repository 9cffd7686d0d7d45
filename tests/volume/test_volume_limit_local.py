"""A volume slower than its forecast is not killed at the limit the forecast gave while the
lease has room: the driver widens it from the measured rate, the watchdog follows, and a
``volume.limit`` event says so (runner/volume_limit.py)."""

from __future__ import annotations

from pathlib import Path

from tests.runner.test_stages_kit import events_of, outcomes, run_runner
from tests.volume.kit import ledger_ids, make_volume, set_params


def test_a_slow_volume_widens_its_time_limit_and_ends(tmp_path: Path) -> None:
    # 400 items of 0.1 s on 2 workers (20 s of work) under a 15 s limit from the forecast
    spec, ids = make_volume(tmp_path, 400, workers=2, batch_size=10, time_limit_s=15.0,
                            limit_adapts=True)
    set_params(spec, delay_s=0.1)
    run_dir = tmp_path / "runs" / "v1"
    done = run_runner(spec, run_dir, "--stages", "pilot", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = events_of(run_dir)
    assert outcomes(events)["pilot"].type == "stage.passed"
    widened = [e for e in events if e.type == "volume.limit"]
    assert widened and widened[0].data["was_s"] == 15.0
    assert widened[0].data["limit_s"] > widened[0].data["projected_s"] > 12.0
    assert sorted(ledger_ids(run_dir)) == sorted(ids)
