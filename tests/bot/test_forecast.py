"""The volume forecast from recorded pilot figures (a pure function)."""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from bot.pilot.forecast import (
    ASSUMED_CV,
    RAY_START_S,
    ForecastInputs,
    Sample,
    Setup,
    card_cost,
    forecast,
    item_spread,
    quantile,
    size_fit,
    t95,
)

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
    fc = forecast(h100(setup=Setup(diagnostics_s=5.4)))
    assert fc.possible and fc.fits is True
    n = fc.numbers
    assert (n["p50_s"], n["p90_s"], n["workers"]) == (pytest.approx(0.35), 0.4, 7)
    sd = statistics.stdev(s.seconds for s in TEN)                   # 10 items, each timed
    assert n["mean_s"] == pytest.approx(0.35) and n["sd_s"] == pytest.approx(sd)
    # middle: 100,000 × 0.35 s ÷ 7 = 5000 s; sd of the total: 100,000 × sd × √(1/10 +
    # 1/100,000) ÷ 7; the range: ± t(9 df) = 1.833 of it, + one last batch on the high side
    sd_total = 100_000 * sd * math.sqrt(1 / 10 + 1 / 100_000) / 7
    assert n["proc_mid_s"] == 5000.0 and n["z"] == 1.833
    assert n["proc_low_s"] == pytest.approx(5000 - 1.833 * sd_total, abs=1e-3)
    assert n["proc_high_s"] == pytest.approx(5000 + 1.833 * sd_total + 0.35, abs=1e-3)
    # setup: the pilot's diagnostics (measured) + a local Ray's start per attempt
    assert n["setup_s"] == pytest.approx(5.4 + RAY_START_S)
    # Ray's start is measured once: the range takes it × 0.5 – × 2
    assert n["low_s"] == pytest.approx(n["setup_s"] - RAY_START_S / 2 + n["proc_low_s"],
                                       abs=1e-3)
    assert n["mid_s"] == pytest.approx(n["setup_s"] + 5000, abs=1e-3)
    assert n["high_s"] == pytest.approx(n["setup_s"] + RAY_START_S + n["proc_high_s"],
                                        abs=1e-3)
    assert round(n["low_s"]) == 4571 and round(n["high_s"]) == 5451
    assert n["finish_low"] == "2026-12-03T13:16:11+00:00"
    assert n["finish_high"] == "2026-12-03T13:30:51+00:00"
    assert n["lease_end"] == "2026-12-08T00:00:00+00:00"
    assert n["margin_s"] == (4 * 86400 + 10 * 3600 + 29 * 60 + 9)
    # 7 cards × 4571.25 s × 50 USD / 86,400 s = 18.5177... -> 18.52 USD
    assert (n["cost_low_usd"], n["cost_high_usd"]) == ("18.52", "22.08")
    assert n["rented_card_hours"] == 8 * 7 * 24
    processing = fc.figure("processing").formula
    assert processing.startswith("middle 100,000 items × 0.35 s mean ÷ 7 workers = "
                                 "1 h 23 min 20 s; ± 1.83 × sd 3 min 58 s")
    assert fc.figure("setup_diagnostics").value == "5.4 s"
    assert "measured on the embedded default" in fc.figure("setup_ray").formula
    assert fc.figure("setup").formula == "5.4 s + 4.6 s = 10 s"
    assert fc.figure("wall").value == "1 h 16 min 11 s – 1 h 30 min 51 s"
    assert fc.figure("workers").formula.startswith("7 cards healthy (proven by the pilot)")
    assert fc.figure("lease_end").formula == "lease.starts_at 2026-12-01 00:00:00 UTC + 7 days"
    assert "/data/corpus" in fc.figure("volume").formula
    # 0.8% of the card-hours: the team may have rented too much
    assert any("under 5%" in note for note in fc.notes)


def test_a_volume_that_does_not_fit_says_by_how_much() -> None:
    late = datetime(2026, 12, 7, 23, 0, 0, tzinfo=UTC)
    fc = forecast(h100(now=late, volume_count=1_000_000, volume_bytes=None))
    assert fc.fits is False
    # the high finish: 2 × 4.6 s Ray (measured once: its range × 2) + 1,000,000 × 0.35 s
    # ÷ 7 + 1.833 × sd_total + 0.35 s
    assert fc.numbers["margin_s"] == 3600 - round(fc.numbers["high_s"])
    assert fc.figure("margin").value == "−14 h 6 min 14 s"
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
    assert one.numbers["proc_mid_s"] == 4375 and round(three.numbers["proc_mid_s"]) == 5833
    assert "no healthy-card count measured" in one.figure("workers").formula
    assert "3 nodes × 2 rented (8 cards ÷ 3 nodes" in three.figure("workers").formula


def test_every_node_offers_its_own_cards_not_the_pilot_nodes_share_of_them() -> None:
    """10 nodes × 8 cards, the pilot's node proved its 8 healthy: 80 workers (the pilot's
    8 ÷ 10 nodes gave 0 and no forecast); 2 nodes: 16, not half the speed."""
    ten = forecast(h100(rented_cards=80, lots=80, nodes=10, healthy_cards=8))
    assert ten.possible and ten.numbers["workers"] == 80
    formula = ten.figure("workers").formula
    assert formula.startswith("8 cards healthy on the pilot's node (proven by the pilot)")
    assert "9 nodes × 8 rented (80 cards ÷ 10 nodes; not proven yet" in formula
    two = forecast(h100(rented_cards=16, lots=16, nodes=2, healthy_cards=8))
    assert two.numbers["workers"] == 16
    assert two.numbers["proc_mid_s"] == pytest.approx(100_000 * 0.35 / 16)
    # a card found faulty on the pilot's node: its other 7, and each other node's 8
    faulty = forecast(h100(rented_cards=16, lots=16, nodes=2, healthy_cards=7))
    assert faulty.numbers["workers"] == 15
    # the pilot ran on a node the volume does not list: every node is its share
    elsewhere = forecast(h100(rented_cards=16, lots=16, nodes=2, healthy_cards=3,
                              pilot_node=None))
    assert elsewhere.numbers["workers"] == 16


def test_a_cpu_volume_counts_the_workers_ray_starts() -> None:
    """The embedded default: one CPU "card" rented, a local Ray starts one worker per core
    of the node, at most 4 (runner/volume.py); a cluster one per core of every node."""
    cpu = h100(gpus=False, rented_cards=1, lots=1, healthy_cards=None)
    two = forecast(replace(cpu, cores=2))
    assert (two.numbers["workers"], two.numbers["cards_used"]) == (2, 1)
    assert two.numbers["proc_mid_s"] == pytest.approx(100_000 * 0.35 / 2)
    assert two.figure("workers").formula == (
        "CPU volume on a local Ray: one worker per core, at most 4: min(4, 2 cores on the "
        "pilot's node) = 2 workers")
    assert forecast(replace(cpu, cores=16)).numbers["workers"] == 4
    assert forecast(replace(cpu, cores=2, nodes=3)).numbers["workers"] == 6
    unknown = forecast(cpu)
    assert unknown.numbers["workers"] == 1 and "cores unknown" in unknown.figure("workers").formula


def test_the_setup_of_a_cluster_each_part_with_its_formula() -> None:
    fc = forecast(h100(rented_cards=16, lots=16, nodes=2, healthy_cards=8,
                       volume_bytes=500_000_000,
                       setup=Setup(diagnostics_s=6.0, dispatch_s=1.5, proof_s=4.0, ssh=True)))
    n = fc.numbers
    # 500 MB ÷ 50 MB/s for each of 2 nodes, through the bot's one uplink
    assert (n["setup_diagnostics_s"], n["setup_dispatch_s"], n["setup_upload_s"],
            n["setup_proof_s"], n["setup_ray_s"]) == (6.0, 1.5, 20.0, 4.0, 2 * RAY_START_S)
    assert n["setup_s"] == pytest.approx(6.0 + 1.5 + 20.0 + 4.0 + 2 * RAY_START_S)
    assert n["low_s"] == pytest.approx(n["setup_s"] - RAY_START_S + n["proc_low_s"], abs=1e-3)
    assert fc.figure("setup_upload").formula == ("500,000,000 B ÷ 50 MB/s (estimated: not "
                                                 "measured) × 2 nodes, the bot's uplink "
                                                 "shared by the nodes' copies")
    assert "on every node at once" in fc.figure("setup_proof").formula
    assert "× 2: the head, then the 1 other node 8 at a time" in fc.figure("setup_ray").formula
    assert fc.figure("setup").formula == "6 s + 1.5 s + 20 s + 4 s + 9.2 s = 40.7 s"


def test_a_pilot_in_one_batch_has_a_range_not_a_point() -> None:
    """12 items in one batch of 12: each carries the batch's time ÷ 12, so the items'
    spread is unknown; the range assumes one instead of being zero wide."""
    one_batch = tuple(Sample(0.25, 1000, batch=0) for _ in range(12))
    fc = forecast(h100(samples=one_batch, accepted=12, volume_count=2_000, healthy_cards=2))
    n = fc.numbers
    assert n["units"] == 1 and n["sd_s"] == pytest.approx(ASSUMED_CV * 0.25)
    sd_total = 2_000 * 0.125 * math.sqrt(1 / 12 + 1 / 2_000) / 2
    assert n["proc_mid_s"] == 250.0
    assert n["proc_low_s"] == pytest.approx(250 - 1.645 * sd_total, abs=1e-3)
    assert n["proc_high_s"] == pytest.approx(250 + 1.645 * sd_total + 0.25, abs=1e-3)
    assert any("spread between items was not measured" in note for note in fc.notes)
    assert "one measurement of 12 items" in fc.figure("per_item").formula


def test_batches_count_once_each_in_the_spread() -> None:
    """Three batches of 4, each item carrying its batch's mean: the items' variance is
    Σ k (batch mean − mean)² ÷ (batches − 1), with t at 2 degrees of freedom."""
    batches = [0.2, 0.3, 0.4]
    samples = tuple(Sample(t, 1000, batch=b) for b, t in enumerate(batches) for _ in range(4))
    spread = item_spread(samples, [s.seconds for s in samples])
    assert spread.units == 3 and spread.items == 12 and spread.z == t95(2) == 2.920
    assert spread.mean == pytest.approx(0.3)
    assert spread.sd == pytest.approx(math.sqrt(4 * (0.01 + 0 + 0.01) / 2))
    # the same 12 values timed one by one: 11 degrees of freedom, a narrower sd
    alone = item_spread(tuple(replace(s, batch=None) for s in samples),
                        [s.seconds for s in samples])
    assert alone.units == 12 and alone.z == 1.796 and alone.sd < spread.sd


def test_a_heavy_tail_widens_the_high_end() -> None:
    light = tuple(Sample(t, 1000) for t in (0.9, 1.0, 1.1) * 4)
    heavy = tuple(Sample(t, 1000) for t in (0.5,) * 11 + (6.0,))
    fc_light, fc_heavy = forecast(h100(samples=light)), forecast(h100(samples=heavy))
    assert not any("heavy tail" in note for note in fc_light.notes)
    assert any("heavy tail" in note for note in fc_heavy.notes)
    n = fc_heavy.numbers
    above, below = n["proc_high_s"] - n["proc_mid_s"], n["proc_mid_s"] - n["proc_low_s"]
    assert above > 1.5 * below
    assert "heavy tail: skewness" in fc_heavy.figure("processing").formula


def test_the_range_is_not_items_times_the_p90() -> None:
    """The total of many items varies far less than each item: 100,000 items of the TEN
    sample end near their mean, not at 100,000 × p90."""
    n = forecast(h100()).numbers
    assert n["proc_high_s"] < 100_000 * n["p90_s"] / 7 - 200


def test_b200_lots_with_two_cards_per_worker() -> None:
    ones = tuple(Sample(1.0, 500) for _ in range(6))
    fc = forecast(h100(samples=ones, accepted=6, volume_count=14_400, volume_bytes=None,
                       rented_cards=8, cards_per_lot=2, lots=4, healthy_cards=8,
                       cards_per_worker=2, lot_price_usd_per_day=Decimal("120")))
    n = fc.numbers
    assert (n["workers"], n["cards_used"]) == (4, 8)
    assert n["proc_mid_s"] == 3600.0     # 14,400 × 1 s ÷ 4
    # 8 cards × low s = card-h × (120 USD ÷ 2 cards ÷ 24 h = 2.50 USD per card-hour)
    assert n["cost_low_usd"] == str(card_cost(n["low_s"], 8, Decimal("120"), 2))
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
    assert fc.numbers["proc_mid_s"] == pytest.approx(2010)
    assert fc.figure("fit").value == "R² = 1.00 (used)"
    assert any("largest input (5,000 B)" in note for note in fc.notes)


def test_a_poor_fit_is_reported_and_not_used() -> None:
    times = [0.5, 0.1, 0.4, 0.2, 0.3, 0.5, 0.1, 0.3]
    samples = tuple(Sample(t, 100 * (k + 1)) for k, t in enumerate(times))
    fc = forecast(h100(samples=samples))
    assert "(not used)" in fc.figure("fit").value
    assert fc.numbers["proc_mid_s"] == pytest.approx(100_000 * statistics.fmean(times) / 7)


def test_equal_sizes_are_not_fitted() -> None:
    assert size_fit(TEN) is None


def test_memory_against_the_card() -> None:
    fc = forecast(h100(peak_memory_gib=76.0, card_memory_gib=80.0))
    assert fc.figure("memory").value == "95%"
    assert any("memory peak is 95%" in note for note in fc.notes)


def test_card_cost_rounds_half_up_to_the_cent() -> None:
    assert card_cost(86400.0, 1, Decimal("0.005"), 1) == Decimal("0.01")
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.9) == pytest.approx(3.7)


def test_ray_starts_on_the_head_then_the_other_nodes_eight_at_a_time() -> None:
    """bot/dispatch/ray_cluster.py starts the head, then the others RAY_START_AT_ONCE at a
    time: 10 nodes are three starts long, not ten."""
    from bot.dispatch.ray_cluster import RAY_START_AT_ONCE as DISPATCH_AT_ONCE
    from bot.pilot.forecast import RAY_START_AT_ONCE

    assert RAY_START_AT_ONCE == DISPATCH_AT_ONCE
    ten = forecast(h100(rented_cards=80, lots=10, cards_per_lot=8, nodes=10, healthy_cards=8))
    assert ten.numbers["setup_ray_s"] == pytest.approx(3 * RAY_START_S)
    assert "× 3: the head, then the 9 other nodes 8 at a time" in ten.figure("setup_ray").formula
    assert forecast(h100()).numbers["setup_ray_s"] == pytest.approx(RAY_START_S)


def test_the_forecast_says_under_which_threads_the_pilot_measured() -> None:
    """A CPU volume worker runs with 1 torch thread: a pilot measured with 1 matches it; one
    measured with 2 (an older runner) is told as not carrying over (issue 37)."""
    cpu = h100(gpus=False, cores=2, pilot_threads=1,
               pilot_threads_why="1 CPU, as Ray gives each CPU worker of the volume")
    fc = forecast(cpu)
    figure = fc.figure("conditions")
    assert figure.value == "the volume worker's threads"
    assert "the pilot measured with 1 torch thread" in figure.formula
    assert "each volume worker runs with 1 torch thread (a CPU worker" in figure.formula
    assert (fc.numbers["pilot_threads"], fc.numbers["worker_threads"]) == (1, 1)
    assert not any("may not carry over" in n for n in fc.notes)
    two = forecast(replace(cpu, pilot_threads=2, pilot_threads_why=None))
    assert two.figure("conditions").value == "other threads than a volume worker's"
    assert any("measured its items with 2 torch threads, each volume worker gets 1" in n
               for n in two.notes)
    # a GPU worker: its node's cores shared by its workers; task.torch_threads wins
    gpu = forecast(h100(cores=56, healthy_cards=7, pilot_threads=8))
    assert gpu.numbers["worker_threads"] == 8 and "56 cores ÷ 7 workers" in \
        gpu.figure("conditions").formula
    assert forecast(h100(torch_threads=3, pilot_threads=3)).numbers["worker_threads"] == 3


def test_the_low_end_is_never_under_the_fastest_measured_pace() -> None:
    """The demo's 12 items in 2 batches: t at 1 degree of freedom is 6.3, and the range's
    low end went to 0 s; it now stops at every item at the fastest batch's pace (issue 37)."""
    two = tuple(Sample(0.004, 100, batch=0) for _ in range(8)) + \
        tuple(Sample(0.009, 100, batch=1) for _ in range(4))
    fc = forecast(h100(samples=two, accepted=12, volume_count=3_000, gpus=False, cores=2))
    n = fc.numbers
    assert n["units"] == 2 and n["z"] == 6.314
    assert n["proc_low_s"] == pytest.approx(3_000 * 0.004 / 2)
    assert "the low side never under 3,000 items at the fastest measured 0.004 s per item " \
           "÷ 2" in fc.figure("processing").formula
