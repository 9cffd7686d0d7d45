"""The interconnect stage: an all-reduce over every healthy card, then pairwise rounds.

Bus bandwidth (``busbw = algbw × 2(n−1)/n``, the nccl-tests convention) at the largest
message size is compared with the catalog's reference for this model and card count
(``hardware.allreduce_busbw_gbps``). Below ``SLOW_RATIO`` × the reference the link is
slow; the pair rounds (disjoint pairs, timed in the same processes) then name the slow
pair, or the card in every slow pair. A slow link fails the stage unless
``diagnostics.slow_card`` is ``warn``. One card: a soft skip. On CPU the same code runs on
gloo, one process per "card" (how the tests exercise it).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

from runner.cards import card_label, healthy_cards, judge_link, judge_pairs, pair_rounds
from runner.stage import (
    STAGES_BY_NAME,
    StageContext,
    StageFailure,
    StageSkipped,
    stage_timeout,
)

MIB = 1 << 20
GPU_SIZES, GPU_ITERS = (8 * MIB, 64 * MIB, 256 * MIB), 20
CPU_SIZES, CPU_ITERS = (256 * 1024, 4 * MIB), 5
COLLECTIVE_SHARE = 0.8  # of the stage's timeout, so the stage reports before it is killed
HINT = ("ask the provider to check the links (nvidia-smi topo -m, nvidia-smi nvlink -s) or "
        "for a replacement node; or set diagnostics.slow_card: warn to continue on the "
        "healthy cards, which the volume will do")


def linked_cards(ctx: StageContext) -> List[int]:
    """The cards to link: the healthy cards the earlier stages left, else every card."""
    for stage in ("compute", "device"):
        healthy = ctx.facts.get(stage, {}).get("healthy_cards")
        if isinstance(healthy, list):
            return [int(c) for c in healthy]
    count = ctx.facts.get("device", {}).get("count")
    return list(range(int(count))) if isinstance(count, int) else []


def interconnect(ctx: StageContext) -> Dict[str, Any]:
    from runner.collective import CollectiveError, run_allreduce

    spec = ctx.spec
    cards = linked_cards(ctx)
    on_gpu = ctx.device != "cpu"
    library = ("rccl" if spec.backend == "rocm" else "nccl") if on_gpu else "gloo"
    facts: Dict[str, Any] = {"cards": cards, "library": library, "warnings": []}
    if len(cards) < 2:
        raise StageSkipped("one card", facts=facts)
    n = len(cards)
    budget = stage_timeout(STAGES_BY_NAME["interconnect"], spec) * COLLECTIVE_SHARE
    try:
        result = run_allreduce(
            n, backend="nccl" if on_gpu else "gloo", device="cuda" if on_gpu else "cpu",
            cards=cards, sizes=GPU_SIZES if on_gpu else CPU_SIZES,
            iters=GPU_ITERS if on_gpu else CPU_ITERS, timeout_s=budget,
            rounds=pair_rounds(list(range(n))) if n > 2 else ())
    except CollectiveError as exc:
        raise StageFailure("interconnect", f"{library} all-reduce over cards {cards}: {exc}",
                           facts=facts, error_type="CollectiveFailed", hint=HINT) from exc
    facts.update(result)
    refs = spec.hardware.allreduce_busbw_gbps
    link = judge_link(result["busbw_gbps"], refs.get(str(n)))
    facts["link"] = link
    bus = {c.get("index"): c.get("bus_id")
           for c in ctx.facts.get("device", {}).get("devices", []) if isinstance(c, dict)}
    slow, blamed = _pairs(facts, refs.get("2"), link["verdict"] == "slow", bus)
    facts["healthy_cards"] = healthy_cards(cards, blamed)
    if link["verdict"] in ("slow", "no figure"):
        _report(ctx, facts, f"{link['reason']}{slow}")
    return facts


def _pairs(facts: Dict[str, Any], pair_ref: Optional[float], link_slow: bool,
           bus: Dict[Any, Any]) -> Tuple[str, List[int]]:
    """The pair verdict (always in the facts) and, when the link is slow, who is to blame.

    A slow link alone takes no card out of the healthy ones (the volume's workers do not
    talk to each other); the card in every slow pair does.
    """
    figures: Dict[Tuple[int, int], Any] = {}
    for key, value in facts.get("pairs_gbps", {}).items():
        a, b = key.split("-")
        figures[(int(a), int(b))] = value
    if not figures:
        return "", []
    verdict = judge_pairs(figures, pair_ref)
    facts["pairs"] = verdict
    named = ", ".join("-".join(map(str, p)) for p in verdict["slow_pairs"])
    if not link_slow:
        if named:
            facts["warnings"].append(f"pairs slower than the others: {named}")
        return "", []
    if verdict["card"] is not None:
        card = int(verdict["card"])
        return f"; {card_label(card, bus.get(card))} is in every slow pair", [card]
    if named:
        return f"; slow pairs: {named}", []
    return "; every pair is equally slow: the fabric, not one card", []


def _report(ctx: StageContext, facts: Dict[str, Any], message: str) -> None:
    if ctx.spec.diagnostics.slow_card == "warn":
        facts["warnings"].append(message)
        return
    raise StageFailure("interconnect", message, facts=facts, error_type="SlowLink", hint=HINT)


__all__ = ["interconnect", "linked_cards"]
