"""The compute stage on every card at once: one thread per card, all timed together.

Each thread makes its card current, checks fp32/bf16/fp16 matmuls against a float64 CPU
product, waits for the others, then times bf16 and fp32 matmuls while its neighbours do
the same, so a card that throttles under the heat and power of a full node shows. The
figures are judged by runner.cards: a wrong result fails the stage naming the card; a
card below ``SLOW_RATIO`` × its peers' median bf16 figure, or below the catalog's
``bf16_floor_tflops``, is slow (a failure unless ``diagnostics.slow_card: warn``). Either
way, fewer healthy cards left than the run needs fail the stage (``NoHealthyCard``,
runner.stages.cardset.require_healthy).
"""

from __future__ import annotations

import statistics
import threading
from typing import Any, Callable, Dict, List, Optional

from runner.cards import card_label, healthy_cards, judge_results, judge_speed
from runner.stage import StageContext, StageFailure

BARRIER_TIMEOUT_S = 120.0
Measure = Callable[..., Any]


def measure_card(torch: Any, index: int, check_n: int, timed_n: int, dtypes: List[str],
                 barrier: threading.Barrier, error_of: Measure, timed: Measure,
                 ) -> Dict[str, Any]:
    """One card's errors per dtype and its bf16/fp32 TFLOP/s (run in the card's thread)."""
    torch.cuda.set_device(index)
    dev = f"cuda:{index}"
    out: Dict[str, Any] = {"check": {}}
    try:
        for name in dtypes:
            out["check"][name] = error_of(torch, dev, getattr(torch, name), check_n)
    finally:
        try:
            barrier.wait(BARRIER_TIMEOUT_S)  # start the timed part together
        except threading.BrokenBarrierError:
            pass
    for name, key in (("bfloat16", "bf16"), ("float32", "fp32")):
        tflops, iters = timed(torch, dev, getattr(torch, name), timed_n, True)
        out[f"{key}_tflops"], out[f"{key}_iterations"] = round(tflops, 4), iters
    return out


def measure_all(torch: Any, cards: List[int], check_n: int, timed_n: int,
                dtypes: List[str], error_of: Measure, timed: Measure) -> Dict[int, Dict[str, Any]]:
    """Every card in its own thread; a card whose thread raised gets ``{"error": ...}``."""
    barrier = threading.Barrier(len(cards))
    results: Dict[int, Dict[str, Any]] = {}

    def work(index: int) -> None:
        try:
            results[index] = measure_card(torch, index, check_n, timed_n, dtypes, barrier,
                                          error_of, timed)
        except Exception as exc:  # noqa: BLE001 - a card that raises is that card's verdict
            barrier.abort()
            results[index] = {"error": f"{type(exc).__name__}: {exc}", "check": {}}

    threads = [threading.Thread(target=work, args=(i,), name=f"compute-gpu{i}", daemon=True)
               for i in cards]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return results


def judge_compute(ctx: StageContext, results: Dict[int, Dict[str, Any]],
                  tolerance: Dict[str, float], facts: Dict[str, Any]) -> None:
    """Per-card verdicts into ``facts["cards"]``, the run-level figures, and the failure."""
    from runner.stages.cardset import report_slow, require_healthy

    hw = ctx.spec.hardware
    device = ctx.facts.get("device", {})
    bus = {int(k): c.get("bus_id") for k, c in (device.get("cards") or {}).items()}
    wrong = judge_results({i: r["check"] for i, r in results.items() if "error" not in r},
                          tolerance)
    wrong.update({i: f"matmul raised {r['error']}" for i, r in results.items() if "error" in r})
    speed = judge_speed({i: r.get("bf16_tflops") for i, r in results.items() if i not in wrong},
                        floor=hw.bf16_floor_tflops)
    wrong.update({i: str(r["reason"]) for i, r in speed.items() if r["verdict"] == "no figure"})
    cards = {str(i): _card_row(ctx, r, speed.get(i, {}), wrong.get(i))
             for i, r in sorted(results.items())}
    facts["cards"] = cards
    _headline(ctx, cards, facts)
    before = device.get("healthy_cards")
    facts["healthy_cards"] = healthy_cards(
        before if isinstance(before, list) else results,
        (int(k) for k, r in cards.items() if r["verdict"] != "ok"))
    require_healthy(ctx, "compute", cards, facts, bus)
    if wrong:
        named = "; ".join(f"{card_label(i, bus.get(i))}: {m}" for i, m in sorted(wrong.items()))
        raise StageFailure(
            "compute", named, facts=facts, error_type="WrongResult",
            hint="the card computes wrong results: do not run the job on it; ask the provider "
                 "for a replacement (nvidia-smi -q -d ECC / rocm-smi show its memory errors)")
    slow = [f"{card_label(int(k), bus.get(int(k)))}: {r['reasons'][0]}"
            for k, r in cards.items() if r["verdict"] == "slow"]
    if slow:
        report_slow(ctx, "compute", slow, facts)


def _card_row(ctx: StageContext, result: Dict[str, Any], judged: Dict[str, Any],
              wrong: Optional[str]) -> Dict[str, Any]:
    hw = ctx.spec.hardware
    row = {k: v for k, v in result.items() if k != "error"}
    row["bf16_fraction_of_peak"] = _fraction(result.get("bf16_tflops"), hw.bf16_tflops)
    row["fp32_fraction_of_peak"] = _fraction(result.get("fp32_tflops"), hw.fp32_tflops)
    row["ratio_to_peers"] = judged.get("ratio_to_peers")
    if wrong is not None:
        row["verdict"], row["reasons"] = "fault", [wrong]
    elif judged.get("verdict") not in (None, "ok"):
        row["verdict"], row["reasons"] = "slow", [str(judged["reason"])]
    else:
        row["verdict"], row["reasons"] = "ok", []
    return row


def _headline(ctx: StageContext, cards: Dict[str, Any], facts: Dict[str, Any]) -> None:
    """The stage's own ``bf16_tflops`` / ``fp32_tflops``: the median of the cards without
    a fault, and its fraction of the catalog's peak."""
    hw = ctx.spec.hardware
    for key, peak in (("bf16", hw.bf16_tflops), ("fp32", hw.fp32_tflops)):
        good = [r[f"{key}_tflops"] for r in cards.values()
                if r["verdict"] != "fault" and isinstance(r.get(f"{key}_tflops"), float)]
        median = round(statistics.median(good), 4) if good else None
        facts[f"{key}_tflops"], facts[f"{key}_peak_tflops"] = median, peak
        facts[f"{key}_fraction_of_peak"] = _fraction(median, peak)


def _fraction(value: Any, peak: Any) -> Any:
    if isinstance(value, (int, float)) and isinstance(peak, (int, float)) and peak:
        return round(value / peak, 4)
    return None


__all__ = ["measure_all", "measure_card", "judge_compute"]
