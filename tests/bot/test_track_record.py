"""Every volume's forecast scored against its actual, kept and shown: `preflight runs`
(its column, its summary line and its --json) tells a team how far to trust the next one."""

from __future__ import annotations

from bot.console.runs import runs_lines
from bot.pilot.track_record import record_line, score_of
from tests.bot.runs import run_of


def volume(run_id: str, error: float, within: bool, **extra: object) -> object:
    return run_of(id=run_id, kind="volume", status="passed", outcome="passed",
                  forecast={"actual_s": 10.0, "error_pct": error, "within_range": within,
                            "scored": "whole", "calibrated": True, **extra})


def test_each_volume_keeps_its_score_and_the_record_sums_them_up() -> None:
    runs = [volume("20261203T100000Z-demo-v1", -45.5, False, calibrated=False),
            volume("20261204T100000Z-demo-v2", 6.8, True),
            volume("20261205T100000Z-demo-v3", -2.0, True, scored="partial"),
            run_of(id="20261205T090000Z-demo-a3")]                   # a pilot: no score
    scores = [score_of(r) for r in runs]  # type: ignore[arg-type]
    assert [s.cell() if s else None for s in scores] == [
        "−45.5% out", "+6.8% in", "−2.0% in*", None]
    line = record_line(runs)  # type: ignore[arg-type]
    assert line == ("Forecast track record: 3 volumes scored (2 calibrated); median error "
                    "6.8% of the middle, 2 of 3 inside the range; worst −45.5% "
                    "(20261203T100000Z)")
    lines = runs_lines(runs, width=160)  # type: ignore[arg-type]
    assert "forecast" in lines[0] and "+6.8% in" in lines[2] and lines[-1] == line


def test_a_volume_not_scored_yet_or_a_forged_score_shows_nothing() -> None:
    assert score_of(run_of(id="v", kind="volume", forecast={"possible": True})) is None
    assert score_of(run_of(id="v", kind="volume",
                           forecast={"error_pct": "bad", "within_range": True})) is None
    assert record_line([run_of(id="a")]) is None
