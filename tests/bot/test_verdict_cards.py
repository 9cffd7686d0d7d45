"""The pilot's verdict and the healthy cards (issue #23 follow-up): a pilot whose card
stages left fewer healthy cards than its volume needs (one, or volume.cards_per_worker)
does not pass, even when every stage passed (an older runner's warnings)."""

from __future__ import annotations

from typing import Any

from bot.pilot.verdict import judge
from tests.bot.manifest_helpers import merged
from tests.bot.runs import run_of

BALANCE = {"ok": True, "accepted": 11, "refused": 1, "total": 12, "problems": []}


def stages(healthy: list[int], cards: int = 2) -> list[dict[str, Any]]:
    rows = {str(i): {"verdict": "ok" if i in healthy else "slow",
                     "reasons": [] if i in healthy else
                     ["bf16 matmul 300 TFLOP/s, below this model's floor of 500 TFLOP/s"]}
            for i in range(cards)}
    return [{"stage": "device", "state": "passed",
             "facts": {"healthy_cards": list(range(cards))}},
            {"stage": "compute", "state": "passed",
             "facts": {"healthy_cards": healthy, "cards": rows}}]


def run(**volume: Any) -> Any:
    extra = {"volume": {"inputs": {"dir": "data/volume", "expected_count": 100},
                        **volume}} if volume else {}
    return run_of(manifest_json=merged(**extra), balance=BALANCE,
                  success={"min_accepted": 11, "max_refused": 1})


def test_a_pilot_with_no_healthy_card_left_does_not_pass() -> None:
    verdict = judge(run(), stages([]), {"status": "passed"})
    assert not verdict["passed"]
    failed = [c["text"] for c in verdict["checks"] if not c["ok"]]
    assert failed == ["healthy cards: 0 of 2 left, 1 needed (compute left out "
                      "GPU 0: bf16 matmul 300 TFLOP/s, below this model's floor of 500 "
                      "TFLOP/s; GPU 1: bf16 matmul 300 TFLOP/s, below this model's floor of "
                      "500 TFLOP/s): replace the node or ask the provider"]


def test_fewer_healthy_cards_than_a_worker_owns_does_not_pass() -> None:
    verdict = judge(run(cards_per_worker=2), stages([0]), {"status": "passed"})
    assert not verdict["passed"]
    assert any(c["text"].startswith("healthy cards: 1 of 2 left, 2 needed "
                                    "(volume.cards_per_worker)") for c in verdict["checks"])


def test_enough_healthy_cards_pass_and_say_so() -> None:
    verdict = judge(run(), stages([0]), {"status": "passed"})
    assert verdict["passed"]
    assert {"ok": True, "text": "healthy cards: 1 of 2 left, 1 needed"} \
        in verdict["checks"]
    cpu = judge(run(), [], {"status": "passed"})  # no card stage: no card check
    assert cpu["passed"] and not any("healthy" in c["text"] for c in cpu["checks"])
