"""A volume node's card proof that leaves fewer healthy cards than a worker owns is refused
with the reason, never counted as a node with its share (issue #23 follow-up).

The proof's events are the ones the runner writes for the compute stage's own verdict
(runner.stages.compute_cards.judge_compute on the volume's spec), so the rule tested is
the runner's and the bot's together.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.card_proof import read_proof
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages.compute_cards import judge_compute

TOL = {"float32": 2e-3, "bfloat16": 2e-2}
NODE = SSHNode(host="10.0.0.2", workdir="/w")


def proof_events(tmp_path: Path, bf16: dict[int, float], cards_per_worker: int) -> str:
    """The runner's stdout for a proof whose compute stage judged ``bf16``."""
    spec = RunSpec.from_dict({
        "run_id": "v1", "name": "cards", "inputs": {"dir": str(tmp_path)},
        "hardware": {"gpu": "H100", "lots": len(bf16), "cards_per_lot": 1,
                     "bf16_tflops": 989.0, "bf16_floor_tflops": 500.0},
        "diagnostics": {"slow_card": "warn"},
        "volume": {"cards_per_worker": cards_per_worker}})
    cards = {str(i): {"verdict": "ok", "reasons": []} for i in bf16}
    device = {"device": "cuda", "cards": cards, "healthy_cards": sorted(bf16)}
    events = [{"type": "stage.passed", "stage": s, "facts": {}}
              for s in ("prepare", "interpreter", "torch")]
    events.append({"type": "stage.passed", "stage": "device", "facts": device})
    facts: dict[str, Any] = {}
    results = {i: {"check": {"float32": 1e-4, "bfloat16": 1e-3}, "bf16_tflops": v,
                   "fp32_tflops": 50.0} for i, v in bf16.items()}
    try:
        judge_compute(StageContext(spec=spec, run_dir=str(tmp_path), facts={"device": device}),
                      results, TOL, facts)
        events.append({"type": "stage.passed", "stage": "compute", "facts": facts})
    except StageFailure as failure:
        events.append({"type": "stage.failed", "stage": "compute", "facts": failure.facts,
                       "error": {"type": failure.error_type, "message": failure.message,
                                 "hint": failure.hint}})
    return "\n".join(json.dumps(e) for e in events) + "\n"


def test_a_node_with_every_card_below_the_floor_is_refused_naming_the_cards(
        tmp_path: Path) -> None:
    out = proof_events(tmp_path, {0: 300.0, 1: 310.0}, 1)
    with pytest.raises(DispatchError) as caught:
        read_proof(1, NODE, True, 1, out, "")
    text = str(caught.value)
    assert text.startswith("volume.nodes[1] (")
    assert "the card proof failed at the compute stage: NoHealthyCard: compute left 0 " \
           "healthy card(s) of 2, the run needs 1: GPU 0: bf16 matmul 300 TFLOP/s" in text
    assert "replacement node" in text and text.endswith("nothing was started")


def test_a_node_with_fewer_healthy_cards_than_a_worker_owns_is_refused(
        tmp_path: Path) -> None:
    out = proof_events(tmp_path, {0: 790.0, 1: 795.0, 2: 300.0, 3: 785.0}, 4)
    with pytest.raises(DispatchError, match=r"compute left 3 healthy card\(s\) of 4, the run "
                                            r"needs 4 \(volume.cards_per_worker\)"):
        read_proof(0, NODE, True, 1, out, "")


def test_a_node_with_a_slow_card_among_good_ones_offers_the_good_ones(tmp_path: Path) -> None:
    out = proof_events(tmp_path, {0: 790.0, 1: 795.0, 2: 300.0, 3: 785.0}, 1)
    proof = read_proof(0, NODE, True, 0, out, "")
    assert proof.cards == (0, 1, 3)
    assert [e["card"] for e in proof.excluded] == [2]
    assert "below this model's floor of 500 TFLOP/s" in proof.excluded[0]["reason"]


def test_a_node_whose_slow_link_leaves_fewer_cards_than_a_worker_owns_is_refused(
        tmp_path: Path) -> None:
    from runner.cards import tolerate_card_verdict

    out = proof_events(tmp_path, {0: 790.0, 1: 795.0, 2: 780.0, 3: 785.0}, 4)
    spec = RunSpec.from_dict({"run_id": "v1", "name": "cards", "inputs": {"dir": "."},
                              "volume": {"cards_per_worker": 4}})
    link = tolerate_card_verdict(spec, "interconnect", {
        "status": "failed", "facts": {"healthy_cards": [0, 1, 3], "cards": [0, 1, 2, 3]},
        "error": {"type": "SlowLink", "message": "GPU 2 is in every slow pair"}})
    out += json.dumps({"type": "stage.failed", "stage": "interconnect", **{
        k: link[k] for k in ("facts", "error")}}) + "\n"
    with pytest.raises(DispatchError, match=r"failed at the interconnect stage: NoHealthyCard: "
                                            r"interconnect left 3 healthy card\(s\), the run "
                                            r"needs 4 \(volume.cards_per_worker\): SlowLink"):
        read_proof(2, NODE, True, 1, out, "")
