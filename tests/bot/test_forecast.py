"""The volume forecast from recorded pilot figures (a pure function)."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from bot.pilot.forecast import ForecastInputs, Sample, card_cost, forecast, quantile, size_fit

UTC = timezone.utc
NOW = datetime(2026, 12, 3, 12, 0, 0, tzinfo=UTC)
LEASE = datetime(2026, 12, 1, 0, 0, 0, tzinfo=UTC)
TEN = tuple(Sample(0.3, 1000) for _ in range(5)) + tuple(Sample(0.4, 1000) for _ in range(5))


def h100(**kw: object) -> ForecastInputs:
    base = ForecastInputs(samples=TEN, accepted=10, volume_count=100_000,
                          volume_bytes=100_000 * 1000, rented_cards=8, cards_per_lot=1, lots=8,
                          days=7, lot_price_usd_per_day=Decimal("50.00"), now=NOW,
                          healthy_cards=7, lease_starts_at=LEASE, volume_where="/data/corpus")
    return replace(base, **kw)


def test_a_volume_that_fits_with_every_formula_to_the_second_and_the_cent() -> None:
    fc = forecast(h100())
    assert fc.possible and fc.fits is True
    n = fc.numbers
    assert (n["p50_s"], n["p90_s"], n["workers"]) == (pytest.approx(0.35), 0.4, 7)
    assert round(n["low_s"]) == 5000 and round(n["high_s"]) == 5714   # 100,000 × s ÷ 7
    assert n["finish_low"] == "2026-12-03T13:23:20+00:00"
    assert n["finish_high"] == "2026-12-03T13:35:14+00:00"
    assert n["lease_end"] == "2026-12-08T00:00:00+00:00"
    assert n["margin_s"] == (4 * 86400 + 10 * 3600 + 24 * 60 + 46)
    # 7 cards × 5000 s = 35,000 card-s × 50 USD / 86,400 s = 20.2546... -> 20.25 USD
    assert (n["cost_low_usd"], n["cost_high_usd"]) == ("20.25", "23.15")
    assert n["rented_card_hours"] == 8 * 7 * 24
    assert n["share_high"] == pytest.approx(40000 / 3600 / 1344, abs=1e-6)
    wall = fc.figure("wall").formula
    assert wall.startswith("100,000 items × 0.35 s p50 ÷ 7 workers = 1 h 23 min 20 s")
    assert "0.4 s p90 = 1 h 35 min 14 s" in wall
    assert fc.figure("workers").formula.startswith("7 cards healthy")
    assert fc.figure("lease_end").formula == "lease.starts_at 2026-12-01 00:00:00 UTC + 7 days"
    assert "/data/corpus" in fc.figure("volume").formula
    # 0.8% of the card-hours: the team may have rented too much
    assert any("under 5%" in note for note in fc.notes)


def test_a_volume_that_does_not_fit_says_by_how_much() -> None:
    late = datetime(2026, 12, 7, 23, 0, 0, tzinfo=UTC)
    fc = forecast(h100(now=late, volume_count=1_000_000, volume_bytes=None))
    assert fc.fits is False
    # 1,000,000 × 0.4 s ÷ 7 = 57,142.857 s; the lease ends one hour after approval
    assert fc.numbers["margin_s"] == 3600 - 57143
    assert fc.figure("margin").value == "−14 h 52 min 23 s"
    assert any("after the lease" in note and "override" in note for note in fc.notes)
    assert not any("under 5%" in note for note in fc.notes)


def test_no_lease_start_means_no_verdict_on_the_fit() -> None:
    fc = forecast(h100(lease_starts_at=None))
    assert fc.possible and fc.fits is None
    assert any("lease.starts_at is not set" in note for note in fc.notes)


def test_a_lease_not_yet_started_counts_from_its_start() -> None:
    fc = forecast(h100(lease_starts_at=datetime(2026, 12, 10, tzinfo=UTC)))
    assert fc.numbers["start"] == "2026-12-10T00:00:00+00:00"
    assert "the lease starts" in fc.figure("finish").formula


@pytest.mark.parametrize("kw,reason", [
    ({"samples": (), "command": True, "task_kind": "custom"}, '"elapsed_s" in its results'),
    ({"samples": (), "task_kind": "train"}, "training pilot records no per-item time"),
    ({"samples": ()}, "recorded no per-item time"),
    ({"samples": TEN[:4], "accepted": 4}, "only 4 accepted items with a measured time"),
    ({"volume_count": 0}, "the volume lists no inputs (/data/corpus)"),
    ({"healthy_cards": 1, "cards_per_worker": 2}, "no worker can run"),
])
def test_it_refuses_to_invent_a_number(kw: dict[str, object], reason: str) -> None:
    fc = forecast(h100(**kw))
    assert not fc.possible and fc.figures == () and reason in (fc.reason or "")
    assert fc.to_dict()["possible"] is False


def test_one_node_against_three() -> None:
    one = forecast(h100(healthy_cards=None, nodes=1))
    three = forecast(h100(healthy_cards=None, nodes=3))
    assert one.numbers["workers"] == 8 and three.numbers["workers"] == 6  # ⌊8 ÷ 3⌋ × 3
    assert round(one.numbers["low_s"]) == 4375 and round(three.numbers["low_s"]) == 5833
    assert "rented (no healthy-card count measured)" in one.figure("workers").formula
    assert "÷ 3 nodes = 2 per node" in three.figure("workers").formula


def test_b200_lots_with_two_cards_per_worker() -> None:
    ones = tuple(Sample(1.0, 500) for _ in range(6))
    fc = forecast(h100(samples=ones, accepted=6, volume_count=14_400, volume_bytes=None,
                       rented_cards=8, cards_per_lot=2, lots=4, healthy_cards=8,
                       cards_per_worker=2, lot_price_usd_per_day=Decimal("120")))
    n = fc.numbers
    assert (n["workers"], n["cards_used"]) == (4, 8)
    assert n["low_s"] == 3600.0 and n["high_s"] == 3600.0     # 14,400 × 1 s ÷ 4
    # 8 cards × 1 h = 8 card-h × (120 USD ÷ 2 cards ÷ 24 h = 2.50) = 20.00 USD
    assert n["cost_low_usd"] == "20.00"
    assert "2.5000 USD per card-hour" in fc.figure("cost").formula
    assert n["rented_card_hours"] == 8 * 7 * 24


def test_time_is_fitted_against_size_when_sizes_differ() -> None:
    samples = tuple(Sample(0.01 + 0.001 * b, b) for b in range(100, 1100, 100))
    fit = size_fit(samples)
    assert fit is not None and fit[0] == pytest.approx(0.01) and fit[1] == pytest.approx(0.001)
    assert fit[2] == pytest.approx(1.0)
    fc = forecast(h100(samples=samples, volume_count=1000, volume_bytes=2_000_000,
                       volume_max_bytes=5000, healthy_cards=1))
    # at the volume's mean 2,000 B: 0.01 + 0.001 × 2000 = 2.01 s per item, × 1000 ÷ 1
    assert round(fc.numbers["low_s"]) == 2010 and round(fc.numbers["high_s"]) == 2010
    assert fc.figure("fit").value == "R² = 1.00 (used)"
    assert any("largest input (5,000 B)" in note for note in fc.notes)


def test_a_poor_fit_is_reported_and_not_used() -> None:
    times = [0.5, 0.1, 0.4, 0.2, 0.3, 0.5, 0.1, 0.3]
    samples = tuple(Sample(t, 100 * (k + 1)) for k, t in enumerate(times))
    fc = forecast(h100(samples=samples))
    assert "(not used)" in fc.figure("fit").value
    assert fc.numbers["low_s"] == pytest.approx(100_000 * quantile(times, 0.5) / 7)


def test_equal_sizes_are_not_fitted() -> None:
    assert size_fit(TEN) is None


def test_memory_against_the_card() -> None:
    fc = forecast(h100(peak_memory_gib=76.0, card_memory_gib=80.0))
    assert fc.figure("memory").value == "95%"
    assert any("memory peak is 95%" in note for note in fc.notes)


def test_card_cost_rounds_half_up_to_the_cent() -> None:
    assert card_cost(86400.0, 1, Decimal("0.005"), 1) == Decimal("0.01")
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(3.7)
