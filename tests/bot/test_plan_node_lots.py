"""Node-sized offers (issue 23): a lot that is one whole 8-card node.

``gpu: H100x8, lots: 10`` is 80 H100 cards on 10 nodes; the price stays lot price x days x
lots (the seed's rule), each node's share is its own 8 cards, and a card-hour costs the lot
price / 8 / 24.
"""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest

from bot.manifest.catalog import default_catalog
from bot.pilot.forecast import card_cost
from bot.pilot.plan import describe_lots, describe_price, make_plan
from bot.pilot.specbuild import build_spec
from runner.cards import judge_count
from runner.spec import node_share
from tests.bot.manifest_helpers import dump, load, locs, make_project, merged

_VI = {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12}


def _nodes(count: int) -> list[dict[str, Any]]:
    return [{"kind": "ssh", "host": f"gpu-{i:02d}.example", "workdir": "/srv/p"}
            for i in range(count)]


def _ten_by_eight(nodes: int = 10, lots: int = 10, gpu: str = "H100x8") -> dict[str, Any]:
    listed = _nodes(nodes)
    return merged(hardware={"gpu": gpu, "lots": lots, "days": 7,
                            "lot_price_usd_per_day": "240.00"},
                  node=listed[0], volume={"inputs": _VI, "nodes": listed})


@pytest.mark.parametrize("name, card", [("H100x8", "H100"), ("8xH100", "H100"),
                                        ("h100-hgx", "H100"), ("H200x8", "H200"),
                                        ("8xh200", "H200"), ("B200x8", "B200"),
                                        ("8xB200", "B200"), ("MI300Xx8", "MI300X"),
                                        ("8xmi300x", "MI300X")])
def test_node_offers_hold_8_cards_with_the_facts_of_their_card(name: str, card: str) -> None:
    catalog = default_catalog()
    offer, single = catalog.get(name), catalog.get(card)
    assert offer is not None and single is not None
    assert (offer.card, offer.cards_per_lot, offer.lot_is_node) == (card, 8, True)
    assert (single.card, single.lot_is_node) == (card, False)
    for fact in ("vendor", "memory_gib", "backends", "bf16_tflops", "fp32_tflops",
                 "bf16_floor_tflops", "allreduce_busbw_gbps"):
        assert getattr(offer, fact) == getattr(single, fact), fact


def test_the_one_card_lots_stay_as_the_seed_guide_says() -> None:
    """A lot holds one card, a B200 lot two; only the node-sized offers hold a node."""
    catalog = default_catalog()
    assert {g.key: g.cards_per_lot for g in catalog.gpus if not g.lot_is_node} == {
        "H100": 1, "H200": 1, "B200": 2, "MI300X": 1, "A100": 1, "L40S": 1, "cpu": 1}
    assert catalog.get("H100-SXM") is catalog.get("H100")  # the one-card aliases unchanged


def test_ten_8_card_lots_are_80_cards_priced_per_lot(tmp_path: Path) -> None:
    make_project(tmp_path)
    plan = make_plan(load(tmp_path, dump(_ten_by_eight())))
    assert (plan.gpu, plan.lots, plan.cards_per_lot, plan.total_cards) == ("H100x8", 10, 8, 80)
    assert plan.total_usd == Decimal("240.00") * 7 * 10 == Decimal("16800.00")
    assert plan.formula == "240.00 USD × 7 days × 10 lots = 16800.00 USD"
    assert plan.memory_per_card_gib == 80 and plan.allreduce_busbw_gbps == {8: 480.0}
    note = next(n for n in plan.notes if "H100x8" in n)
    assert "one node of 8 H100 cards" in note and "10 lots are 10 nodes" in note, note
    assert "not multiplied by the card count" in note
    assert describe_lots(10, 8, 80) == "10 lots × 8 cards per lot = 80 cards"
    assert describe_price("240.00", "H100x8", 8) == (
        "240.00 USD (one H100x8 lot = 8 cards, all covered by this price)")
    assert plan.volume is not None and "10 nodes" in plan.volume and "80 cards" in plan.volume


def test_a_10_node_x_8_manifest_validates_and_each_node_shows_its_8(tmp_path: Path) -> None:
    make_project(tmp_path)
    loaded = load(tmp_path, dump(_ten_by_eight()))
    assert not [w for w in loaded.warnings if w.loc == "volume.cards_per_worker"]
    plan = make_plan(loaded)
    assert node_share(plan.lots, plan.cards_per_lot, 10) == 8
    for kind in ("pilot", "volume"):
        hardware = build_spec(loaded, plan, "r1", kind=kind).hardware
        # the runner names the card it looks for, not the offer (its device stage compares
        # it with the cards' names: "NVIDIA H100 80GB HBM3")
        assert (hardware.gpu, hardware.expected_cards(), hardware.nodes) == ("H100", 8, 10)
        assert judge_count(8, hardware) == ("ok", None)
        verdict, sentence = judge_count(7, hardware)
        assert verdict == "fail" and sentence is not None
        assert "7 card(s) visible, 8 rented on this node" in sentence
        assert "its share of 80 rented (10 lot(s) x 8 card(s) per lot) over 10 node(s)" \
            in sentence


@pytest.mark.parametrize("nodes, lots, loc, fragment", [
    (4, 10, "volume.nodes", "10 lots over 4 nodes do not split evenly"),
    (5, 10, "volume.nodes", "one H100x8 lot is one node: 10 lots are 10 nodes, "
                            "volume.nodes lists 5"),
    (3, 2, "volume.nodes", "2 lots over 3 nodes do not split evenly"),
])
def test_node_lots_that_do_not_match_the_nodes_are_refused(
        tmp_path: Path, nodes: int, lots: int, loc: str, fragment: str) -> None:
    make_project(tmp_path)
    found = locs(tmp_path, dump(_ten_by_eight(nodes=nodes, lots=lots)))
    assert loc in found and fragment in found[loc].message, found


def test_one_card_lots_that_do_not_split_evenly_are_refused(tmp_path: Path) -> None:
    make_project(tmp_path)
    found = locs(tmp_path, dump(_ten_by_eight(nodes=2, lots=3, gpu="H100")))
    assert "3 lots over 2 nodes do not split evenly" in found["volume.nodes"].message


def test_several_node_lots_without_their_nodes_are_refused(tmp_path: Path) -> None:
    """The pilot's node alone would be judged against 80 cards: refused at validation."""
    make_project(tmp_path)
    data = merged(hardware={"gpu": "H100x8", "lots": 10})
    message = locs(tmp_path, dump(data))["hardware.lots"].message
    assert "10 H100x8 lots are 10 nodes" in message and "volume.nodes" in message, message
    one = make_plan(load(tmp_path, dump(merged(hardware={"gpu": "8xH100", "lots": 1}))))
    assert (one.gpu, one.total_cards) == ("H100x8", 8)


def test_a_card_hour_of_an_8_card_lot_is_an_eighth_of_the_lot_hour() -> None:
    lot_price = Decimal("240.00")  # one node for a day: 10 USD a node-hour
    assert card_cost(3600, 1, lot_price, 8) == Decimal("1.25")
    assert card_cost(3600, 8, lot_price, 8) == Decimal("10.00")  # the whole node
    assert card_cost(3600, 80, lot_price, 8) == Decimal("100.00")  # ten nodes
