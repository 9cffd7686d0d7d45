"""The card and link verdict rules, on figures (runner/cards.py)."""

from __future__ import annotations

import math

from runner import cards
from runner.spec import HardwareSpec, node_share


def test_one_slow_card_of_eight_is_named_with_its_peers_median() -> None:
    figures = {i: 790.0 for i in range(8)}
    figures[3] = 412.0
    out = cards.judge_speed(figures)
    assert [i for i, r in out.items() if r["verdict"] == "slow"] == [3]
    assert out[3]["reason"] == "bf16 matmul 412 TFLOP/s, 0.52x its peers' median 790"
    assert out[0]["ratio_to_peers"] == round(790 / 790, 4)


def test_two_cards_the_slow_one_is_still_named() -> None:
    out = cards.judge_speed({0: 800.0, 1: 400.0})
    assert out[1]["verdict"] == "slow" and out[1]["peers_median"] == 800.0
    assert out[0]["verdict"] == "ok"


def test_all_cards_equally_slow_pass_the_peers_but_not_the_floor() -> None:
    figures = {i: 300.0 for i in range(4)}
    assert {r["verdict"] for r in cards.judge_speed(figures).values()} == {"ok"}
    out = cards.judge_speed(figures, floor=700.0)
    assert {r["verdict"] for r in out.values()} == {"slow"}
    assert "below this model's floor of 700 TFLOP/s" in out[0]["reason"]


def test_a_nan_figure_is_named_and_not_counted_among_peers() -> None:
    out = cards.judge_speed({0: 800.0, 1: math.nan, 2: 780.0, 3: None})
    assert out[1]["verdict"] == "no figure" and "nan" in out[1]["reason"]
    assert out[3]["verdict"] == "no figure"
    assert out[0]["peers_median"] == 780.0  # the NaN and the missing card are not peers
    assert out[2]["verdict"] == "ok"


def test_one_card_has_no_peers_and_is_judged_by_the_floor_only() -> None:
    assert cards.judge_speed({0: 10.0})[0]["verdict"] == "ok"
    assert cards.judge_speed({0: 10.0}, floor=50.0)[0]["verdict"] == "slow"


def test_wrong_result_names_the_card_and_a_nan_is_wrong() -> None:
    tol = {"float32": 2e-3, "bfloat16": 2e-2}
    wrong = cards.judge_results({0: {"float32": 1e-4, "bfloat16": 1e-3},
                                 1: {"float32": 0.5, "bfloat16": 1e-3},
                                 2: {"float32": math.nan}}, tol)
    assert sorted(wrong) == [1, 2]
    assert "float32 matmul differs" in wrong[1] and "0.5 > 0.002" in wrong[1]


def test_card_count_against_lots() -> None:
    assert cards.judge_count(8, HardwareSpec(lots=4, cards_per_lot=2)) == ("ok", None)
    level, message = cards.judge_count(7, HardwareSpec(lots=4, cards_per_lot=2))
    assert level == "fail" and message is not None
    assert message.startswith("7 card(s) visible, 8 rented on this node")
    level, message = cards.judge_count(9, HardwareSpec(lots=8, cards_per_lot=1))
    assert level == "warn" and "9 cards visible, 8 rented" in str(message)


def test_each_node_must_show_its_share_of_the_rent() -> None:
    # 10 nodes x 8 cards: 80 rented over all nodes, 8 on each node.
    assert node_share(10, 8, 10) == 8
    assert node_share(10, 8) == 80 and node_share(10, 8, 1) == 80
    assert node_share(1, 8, 3) == 2  # 8 over 3 nodes: 2 each (what a worker is sized on)
    assert node_share(1, 1, 4) == 1  # never 0
    head = HardwareSpec(lots=10, cards_per_lot=8, nodes=10, node_cards=node_share(10, 8, 10))
    assert cards.judge_count(8, head) == ("ok", None)
    level, message = cards.judge_count(7, head)
    assert level == "fail" and str(message).startswith("7 card(s) visible, 8 rented on this "
                                                       "node (its share of 80 rented")
    # An older bot's spec (no node_cards): the whole rent, as before.
    assert HardwareSpec(lots=10, cards_per_lot=8).expected_cards() == 80


def test_health_from_device_facts() -> None:
    bad = {"ecc_volatile_uncorrected": 2, "rows_pending": 1,
           "pcie": {"width_current": 4, "width_max": 16, "gen_current": 1, "gen_max": 5},
           "throttle_reasons": ["hw_thermal_slowdown"], "xid": [{"code": 79}]}
    faults, slow, notes = cards.judge_health(bad)
    assert faults == ["2 volatile uncorrected ECC error(s)",
                      "1 memory row(s) pending remap or retirement"]
    assert slow == ["PCIe link at x4, the card supports x16",
                    "clocks throttled: hw_thermal_slowdown"]
    assert notes[0] == "PCIe gen 1 of 5 (normal at idle)"
    assert "fallen off the bus" in notes[1]
    assert cards.judge_health({"ecc_volatile_uncorrected": 0, "pcie": {}}) == ([], [], [])
    # Figures a tool could not read ("[N/A]" parsed to None) are no verdict either way.
    assert cards.judge_health({"ecc_volatile_uncorrected": None, "rows_pending": "N/A"}) \
        == ([], [], [])


def test_busbw_follows_the_nccl_tests_convention() -> None:
    # 1 GB in 10 ms on 8 ranks: algbw 100 GB/s, busbw 175 GB/s.
    assert math.isclose(cards.busbw(1e9, 0.01, 8), 175.0)
    assert math.isclose(cards.busbw(1e9, 0.01, 2), 100.0)


def test_link_against_its_reference() -> None:
    assert cards.judge_link(470.0, 475.0)["verdict"] == "ok"
    slow = cards.judge_link(300.0, 475.0)
    assert slow["verdict"] == "slow" and slow["fraction"] == round(300 / 475, 4)
    assert slow["reason"] == "all-reduce busbw 300 GB/s, 0.63x the reference 475 GB/s"
    assert cards.judge_link(3.2, None)["verdict"] == "no reference"
    assert cards.judge_link(math.nan, 475.0)["verdict"] == "no figure"


def test_pair_rounds_are_disjoint_and_never_repeat_a_pair() -> None:
    for n in (2, 3, 7, 8):
        rounds = cards.pair_rounds(list(range(n)))
        seen = set()
        for pairs in rounds:
            flat = [c for p in pairs for c in p]
            assert len(flat) == len(set(flat))  # disjoint within a round
            assert not seen & set(pairs)
            seen |= set(pairs)
        assert len(rounds) == min(3, n - 1 + n % 2)
    assert cards.pair_rounds([5]) == []


def test_the_card_in_every_slow_pair_is_blamed() -> None:
    figures = {p: 150.0 for r in cards.pair_rounds(list(range(8))) for p in r}
    for pair in figures:
        if 5 in pair:
            figures[pair] = 40.0
    out = cards.judge_pairs(figures)
    assert out["card"] == 5 and len(out["slow_pairs"]) == 3


def test_one_slow_pair_is_named_without_blaming_either_card() -> None:
    out = cards.judge_pairs({(0, 1): 150.0, (2, 3): 40.0, (4, 5): 151.0}, reference=140.0)
    assert out["slow_pairs"] == [[2, 3]] and out["card"] is None


def test_slow_pairs_without_a_common_card_and_a_nan_pair() -> None:
    out = cards.judge_pairs({(0, 1): 40.0, (2, 3): 41.0, (4, 5): 150.0, (6, 7): math.nan},
                            reference=150.0)
    assert out["slow_pairs"] == [[0, 1], [2, 3], [6, 7]] and out["card"] is None
    assert out["pairs"]["6-7"] is None


def test_healthy_cards_leave_out_every_named_card() -> None:
    assert cards.healthy_cards(range(8), [3], {3, 6}, []) == [0, 1, 2, 4, 5, 7]
    assert cards.card_label(3, "0000:9b:00.0") == "GPU 3 (0000:9b:00.0)"
