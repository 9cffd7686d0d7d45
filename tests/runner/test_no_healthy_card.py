"""Issue #23 follow-up: a card stage that leaves fewer healthy cards than the run needs
fails, whatever ``diagnostics.slow_card`` says (warn only decides for a card among others).

The run needs one healthy card, or ``volume.cards_per_worker`` in a volume's spec (the
volume's head and each node's card proof run the same stages on that spec).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runner.cards import tolerate_card_verdict
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages.cardset import judge_cards
from runner.stages.compute_cards import judge_compute

TOL = {"float32": 2e-3, "bfloat16": 2e-2}


def ctx(tmp_path: Path, *, lots: int = 2, slow_card: str = "warn",
        facts: dict[str, Any] | None = None, volume: dict[str, Any] | None = None,
        **hardware: Any) -> StageContext:
    raw: dict[str, Any] = {
        "run_id": "r1", "name": "cards", "inputs": {"dir": str(tmp_path)},
        "hardware": {"gpu": "H100", "lots": lots, "cards_per_lot": 1, "bf16_tflops": 989.0,
                     **hardware},
        "diagnostics": {"slow_card": slow_card}}
    if volume is not None:
        raw["volume"] = volume
    return StageContext(spec=RunSpec.from_dict(raw), run_dir=str(tmp_path),
                        facts=facts or {"device": {}})


def figures(bf16: dict[int, float]) -> dict[int, dict[str, Any]]:
    return {i: {"check": {"float32": 1e-4, "bfloat16": 1e-3}, "bf16_tflops": v,
                "fp32_tflops": 50.0} for i, v in bf16.items()}


@pytest.mark.parametrize("slow_card", ["warn", "fail"])
def test_compute_with_every_card_below_the_floor_fails_whatever_slow_card_says(
        tmp_path: Path, slow_card: str) -> None:
    facts: dict[str, Any] = {}
    with pytest.raises(StageFailure) as caught:
        judge_compute(ctx(tmp_path, slow_card=slow_card, bf16_floor_tflops=500.0),
                      figures({0: 300.0, 1: 305.0}), TOL, facts)
    failure = caught.value
    assert failure.stage == "compute" and failure.error_type == "NoHealthyCard"
    assert failure.message.startswith("compute left 0 healthy card(s) of 2, the run needs 1: ")
    assert "GPU 0: bf16 matmul 300 TFLOP/s, below this model's floor of 500 TFLOP/s" \
        in failure.message
    assert "GPU 1: bf16 matmul 305 TFLOP/s" in failure.message
    assert facts["cards"]["0"]["verdict"] == "slow"
    assert "replacement node" in (failure.hint or "")
    assert failure.facts["healthy_cards"] == []


def test_one_slow_card_among_good_ones_still_only_warns(tmp_path: Path) -> None:
    facts: dict[str, Any] = {}
    judge_compute(ctx(tmp_path, lots=4, bf16_floor_tflops=500.0),
                  figures({0: 790.0, 1: 795.0, 2: 785.0, 3: 412.0}), TOL, facts)
    assert facts["healthy_cards"] == [0, 1, 2] and len(facts["warnings"]) == 1


def test_a_volume_needs_cards_per_worker_healthy_cards_and_does_not_tolerate_fewer(
        tmp_path: Path) -> None:
    c = ctx(tmp_path, slow_card="fail", bf16_floor_tflops=500.0,
            volume={"cards_per_worker": 2})
    facts: dict[str, Any] = {}
    with pytest.raises(StageFailure) as caught:
        judge_compute(c, figures({0: 790.0, 1: 300.0}), TOL, facts)
    assert caught.value.error_type == "NoHealthyCard"
    assert caught.value.message.startswith(
        "compute left 1 healthy card(s) of 2, the run needs 2 (volume.cards_per_worker): "
        "GPU 0: ok, bf16 matmul 790 TFLOP/s; GPU 1: bf16 matmul 300 TFLOP/s")
    # the volume's ladder goes on with healthy cards only for a card verdict, not this one
    result = {"status": "failed", "facts": caught.value.facts,
              "error": {"type": caught.value.error_type, "message": caught.value.message}}
    assert tolerate_card_verdict(c.spec, "compute", result)["status"] == "failed"


def test_device_with_every_card_slow_fails_with_warn(tmp_path: Path) -> None:
    cards = {str(i): {"index": i, "bus_id": f"0000:{0x18 + i:02x}:00.0",
                      "pcie": {"width_current": 4, "width_max": 16}}
             for i in range(2)}
    facts: dict[str, Any] = {"warnings": []}
    with pytest.raises(StageFailure) as caught:
        judge_cards(ctx(tmp_path), cards, facts)
    assert caught.value.error_type == "NoHealthyCard"
    assert caught.value.message.startswith("device left 0 healthy card(s) of 2")
    assert "GPU 0 (0000:18:00.0): PCIe link at x4" in caught.value.message


def test_a_volume_does_not_go_on_past_a_slow_link_that_leaves_too_few_cards(
        tmp_path: Path) -> None:
    """The interconnect can blame one card (in every slow pair): with four cards and
    ``cards_per_worker: 4`` the three left make no worker; the volume's ladder then fails
    the stage as ``NoHealthyCard`` (the card proof refuses the node for it) instead of
    passing it on the healthy cards."""
    spec = ctx(tmp_path, lots=4, volume={"cards_per_worker": 4}).spec
    slow = {"status": "failed", "facts": {"healthy_cards": [0, 1, 3], "warnings": []},
            "error": {"type": "SlowLink", "message": "all-reduce busbw 200 GB/s, 0.42x the "
                      "reference 480 GB/s; GPU 2 is in every slow pair", "hint": "links"}}
    out = tolerate_card_verdict(spec, "interconnect", slow)
    assert out["status"] == "failed"
    assert out["error"]["type"] == "NoHealthyCard"
    assert out["error"]["message"] == (
        "interconnect left 3 healthy card(s), the run needs 4 (volume.cards_per_worker): "
        "SlowLink: all-reduce busbw 200 GB/s, 0.42x the reference 480 GB/s; GPU 2 is in "
        "every slow pair")
    assert "replacement node" in out["error"]["hint"]
    enough = ctx(tmp_path, lots=4, volume={"cards_per_worker": 1}).spec
    assert tolerate_card_verdict(enough, "interconnect", slow)["status"] == "passed"
