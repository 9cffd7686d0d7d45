"""The forecast again once every node of the volume proved its cards (issue 23): each
node's real healthy cards, not the pilot node's proof and the others' share of the rent."""

from __future__ import annotations

from dataclasses import replace

from bot.pilot.forecast import forecast, proven_cards
from tests.bot.test_forecast import h100


def test_each_proven_node_offers_its_own_healthy_cards() -> None:
    """4 nodes × 8 rented: proofs of 8, 8, 6 healthy and one node dropped give 22 workers,
    where the forecast before approval counted 32 (the pilot's 8 and the others' share)."""
    before = h100(rented_cards=32, lots=32, nodes=4, healthy_cards=8)
    assert forecast(before).numbers["workers"] == 32
    after = forecast(replace(before, node_cards=(8, 8, 6, 0)))
    assert after.possible and after.numbers["workers"] == 22
    assert after.numbers["cards_used"] == 22
    formula = after.figure("workers").formula
    assert "4 nodes proven at the volume's dispatch: 8 + 8 + 6 + 0 = 22 healthy cards of " \
           "32 rented" in formula and "22 workers" in formula
    # fewer workers, longer: 100,000 items × 0.35 s ÷ 22
    assert after.numbers["proc_mid_s"] == round(100_000 * 0.35 / 22, 3)
    assert after.numbers["high_s"] > forecast(before).numbers["high_s"]


def test_two_cards_per_worker_and_a_node_whose_stages_judged_no_card() -> None:
    """A worker takes 2 cards of one node: ⌊7 ÷ 2⌋ = 3 on a node with 7 healthy; a node
    whose proof judged no card (None) counts its share of the rent."""
    inp = h100(rented_cards=16, lots=16, nodes=2, healthy_cards=8, cards_per_worker=2,
               node_cards=(7, None))
    fc = forecast(inp)
    assert fc.numbers["workers"] == 3 + 4 and fc.numbers["cards_used"] == 14
    assert "7 + 8 (not judged: its share) = 15 healthy cards of 16" in \
        fc.figure("workers").formula
    assert proven_cards((7, None), 16, 2) == 15


def test_every_node_dropped_gives_no_forecast_rather_than_a_guess() -> None:
    fc = forecast(h100(rented_cards=16, lots=16, nodes=2, node_cards=(0, 0)))
    assert not fc.possible and "no worker can run" in (fc.reason or "")


def test_the_proofs_count_once_every_node_has_reported_the_latest_each() -> None:
    from bot.service.proven import node_cards

    steps = [{"phase": "uploaded", "index": 0}, {"phase": "proved", "index": 0, "cards": [0]},
             {"phase": "proved", "index": 1, "cards": [0, 1, 2]}]
    assert node_cards(steps, 3) is None  # node 2 not proven yet
    steps += [{"phase": "proved", "index": 2, "cards": None},  # its stages judged no card
              {"phase": "proved", "index": 0, "cards": [0, 1]},  # a later proof of node 0
              {"phase": "proved", "index": 7, "cards": [0]}]  # not a node of the volume
    assert node_cards(steps, 3) == (2, 3, None)
