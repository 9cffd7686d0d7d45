"""The volume's time limit widens from the measured rate, within the lease (and the
watchdog's deadline moves with it)."""

from __future__ import annotations

from runner.volume_limit import GRACE_S, MARGIN, AdaptiveLimit
from runner.watchdog import _widened


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def limit(seconds: float = 600.0, adapts: bool = True, lease: float = 0.0) -> tuple[
        AdaptiveLimit, Clock]:
    clock = Clock()
    wall = Clock()
    wall.now = 1_000_000.0
    return AdaptiveLimit(seconds, adapts=adapts, lease_ends_at=lease, clock=clock,
                         wall=wall), clock


def test_items_slower_than_forecast_widen_the_limit_from_the_measured_rate() -> None:
    lim, clock = limit()
    clock.now = 100.0
    assert lim.check(done=500, left=500, total=1000) is None  # 200 s projected: on pace
    clock.now = 300.0                                           # 1,000 items in 300 s
    event = lim.check(done=1000, left=9000, total=10_000)       # 3,000 s projected
    assert event is not None
    assert event["was_s"] == 600.0 and event["projected_s"] == 3000.0
    assert event["limit_s"] == MARGIN * 3000 + GRACE_S == lim.limit_s
    assert "3e+03 s" not in event["why"] and "from the forecast" in event["why"]
    assert lim.check(done=1100, left=8900, total=10_000) is None  # the new one holds


def test_never_past_the_lease_nor_a_limit_the_manifest_set() -> None:
    lim, clock = limit(lease=1_000_000.0 + 2000.0)              # the lease ends in 2,000 s
    clock.now = 300.0
    event = lim.check(done=1000, left=9000, total=10_000)
    assert event is not None and event["limit_s"] == 2000.0 and event["lease_cut"] is True
    assert lim.check(done=1000, left=9000, total=10_000) is None  # no more room
    fixed, clock = limit(adapts=False)
    clock.now = 300.0
    assert fixed.check(done=1000, left=9000, total=10_000) is None


def test_too_few_items_say_nothing_yet() -> None:
    lim, clock = limit(seconds=10.0)
    clock.now = 5.0
    assert lim.check(done=3, left=9997, total=10_000) is None


def test_the_watchdog_moves_the_deadline_only_forward() -> None:
    event = {"kind": "event", "type": "volume.limit", "data": {"limit_s": 900.0}}
    assert _widened(event, 600.0) == 900.0
    assert _widened(event, 1200.0) is None
    assert _widened({"kind": "event", "type": "progress", "data": {"limit_s": 9e9}}, 1) is None
    assert _widened({"kind": "event", "type": "volume.limit", "data": {"limit_s": "x"}},
                    1) is None
