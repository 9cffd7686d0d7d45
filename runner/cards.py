"""Verdict rules for every card of a node and the links between them: pure functions.

Standard library only and no I/O, so the stages (device, compute, interconnect) and the
tests share one definition of "slow", "wrong", "too few" and "healthy". Figures that are
missing or not a number (NaN, infinity, zero or below) are never taken for a measurement:
a card without a figure is named, never silently ranked.

A card's trouble is one of two kinds:

- a **fault** (wrong result, uncorrected ECC errors, rows waiting to be remapped or
  retired, no figure at all): the card must not run the job; always a failure;
- **slow** (below ``SLOW_RATIO`` × its peers' median or the catalog's floor, a PCIe link
  trained narrower than its maximum, every slow pair of the interconnect): a failure by
  default, a warning with ``diagnostics.slow_card: warn``.

Either way the card leaves ``healthy_cards``, the cards the volume runs on; a node left with
fewer than the run needs (``cards_needed``: 1, or ``volume.cards_per_worker``) fails
(``NoHealthyCard``), whatever ``slow_card`` says.
"""

from __future__ import annotations

import math
import statistics
from typing import Any, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from runner.spec import CARD_STAGES, CARD_VERDICTS, HardwareSpec

SLOW_RATIO = 0.8
Pair = Tuple[int, int]

# Xid codes (NVIDIA's public Xid catalogue) that mean the card itself is in trouble.
XID_MEANINGS = {
    13: "graphics engine exception", 31: "GPU memory page fault",
    43: "GPU stopped processing", 45: "preemptive cleanup",
    48: "double-bit ECC error", 61: "internal micro-controller breakpoint",
    62: "internal micro-controller halt", 63: "ECC page retirement or row remap recorded",
    64: "ECC page retirement or row remap failure", 74: "NVLink error",
    79: "GPU has fallen off the bus", 92: "high single-bit ECC error rate",
    94: "contained ECC error", 95: "uncontained ECC error",
    119: "GSP RPC timeout", 120: "GSP error",
}


def number(value: Any) -> Optional[float]:
    """``value`` as a usable measurement, or None (missing, NaN, infinite, zero or below)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    got = float(value)
    if math.isnan(got) or math.isinf(got) or got <= 0:
        return None
    return got


def card_label(index: int, bus_id: Optional[str] = None) -> str:
    """``GPU 3 (0000:9b:00.0)``, or ``GPU 3`` when the bus id is not known."""
    return f"GPU {index} ({bus_id})" if bus_id else f"GPU {index}"


def fmt(value: float) -> str:
    """A figure for a sentence: 790, 412, 3.2, 0.0041."""
    if value >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def judge_speed(figures: Mapping[int, Any], *, floor: Optional[float] = None,
                ratio: float = SLOW_RATIO, metric: str = "bf16 matmul",
                unit: str = "TFLOP/s") -> Dict[int, Dict[str, Any]]:
    """Per card: its figure, its peers' median, and ``ok`` / ``slow`` / ``no figure``.

    A card's peers are the *other* cards with a usable figure, so with two cards the slow
    one is still named. When every card is equally slow no card is slow against its
    peers: that is what ``floor`` (the catalog's per-model floor) is for.
    """
    usable = {i: number(v) for i, v in figures.items()}
    out: Dict[int, Dict[str, Any]] = {}
    for index in sorted(figures):
        value = usable[index]
        peers = [v for i, v in usable.items() if i != index and v is not None]
        median = statistics.median(peers) if peers else None
        row: Dict[str, Any] = {"value": value, "peers_median": median,
                               "ratio_to_peers": None, "verdict": "ok", "reason": None}
        if value is None:
            row.update(verdict="no figure",
                       reason=f"{metric} gave no usable figure ({figures[index]!r})")
            out[index] = row
            continue
        parts = []
        if median is not None:
            row["ratio_to_peers"] = round(value / median, 4)
            if value < ratio * median:
                parts.append(f"{value / median:.2f}x its peers' median {fmt(median)}")
        if floor is not None and value < floor:
            parts.append(f"below this model's floor of {fmt(floor)} {unit}")
        if parts:
            row.update(verdict="slow",
                       reason=f"{metric} {fmt(value)} {unit}, " + "; ".join(parts))
        out[index] = row
    return out


def judge_results(errors: Mapping[int, Mapping[str, Any]],
                  tolerance: Mapping[str, float]) -> Dict[int, str]:
    """Cards whose result is wrong: ``{index: "bfloat16 matmul max relative error ..."}``.

    ``errors[card][dtype]`` is the max relative error against the CPU reference; a NaN or
    a missing figure is a wrong result too.
    """
    wrong: Dict[int, str] = {}
    for index in sorted(errors):
        for dtype, err in errors[index].items():
            limit = tolerance.get(dtype)
            value = float(err) if isinstance(err, (int, float)) and not isinstance(
                err, bool) else math.nan
            if limit is not None and not value <= limit:  # NaN compares False
                wrong[index] = (f"{dtype} matmul differs from the CPU reference: max "
                                f"relative error {value:.3g} > {limit:g}")
                break
    return wrong


def judge_count(seen: int, hardware: HardwareSpec) -> Tuple[str, Optional[str]]:
    """``("ok" | "fail" | "warn", sentence)`` for the cards seen against this node's share of
    the rent (``HardwareSpec.expected_cards``: the whole rent on a node of its own)."""
    expected = hardware.expected_cards()
    lots, per_lot = int(hardware.lots), int(hardware.cards_per_lot)
    rented = max(1, lots) * max(1, per_lot)
    rent = f"{lots} lot(s) x {per_lot} card(s) per lot"
    if expected != rented:
        rent = f"its share of {rented} rented ({rent}) over {max(1, hardware.nodes)} node(s)"
    if seen < expected:
        return "fail", f"{seen} card(s) visible, {expected} rented on this node ({rent})"
    if seen > expected:
        return "warn", (f"{seen} cards visible, {expected} rented on this node ({rent}): the "
                        f"extra cards are not yours to bill or to use")
    return "ok", None


def judge_health(card: Mapping[str, Any]) -> Tuple[List[str], List[str], List[str]]:
    """``(faults, slow, notes)`` read from one card's device facts (see runner.stages.smi).

    Faults: volatile uncorrected ECC errors, rows pending remap or retirement, a row
    remapping failure. Slow: a PCIe link trained narrower than its maximum, an active
    hardware or thermal slowdown. Notes: a lower PCIe generation (cards drop it at idle
    to save power), Xid errors in the kernel log (they may predate this lease).
    """
    faults: List[str] = []
    slow: List[str] = []
    notes: List[str] = []
    ecc = _int(card.get("ecc_volatile_uncorrected"))
    if ecc:
        faults.append(f"{ecc} volatile uncorrected ECC error(s)")
    pending = _int(card.get("rows_pending"))
    if pending:
        faults.append(f"{pending} memory row(s) pending remap or retirement")
    if card.get("row_remap_failure"):
        faults.append("row remapping failed")
    pcie = card.get("pcie") or {}
    width, width_max = _int(pcie.get("width_current")), _int(pcie.get("width_max"))
    if width and width_max and width < width_max:
        slow.append(f"PCIe link at x{width}, the card supports x{width_max}")
    gen, gen_max = _int(pcie.get("gen_current")), _int(pcie.get("gen_max"))
    if gen and gen_max and gen < gen_max:
        notes.append(f"PCIe gen {gen} of {gen_max} (normal at idle)")
    for reason in card.get("throttle_reasons") or []:
        if any(w in str(reason).lower() for w in ("hw_slowdown", "thermal", "power_brake")):
            slow.append(f"clocks throttled: {reason}")
    for xid in card.get("xid") or []:
        code = _int(xid.get("code")) if isinstance(xid, Mapping) else None
        meaning = XID_MEANINGS.get(code or -1, "see NVIDIA's Xid catalogue")
        notes.append(f"Xid {code} in the kernel log ({meaning})")
    return faults, slow, notes


def _int(value: Any) -> Optional[int]:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, float) and not math.isnan(value):
        return int(value)
    if isinstance(value, str) and value.strip().isdigit():
        return int(value.strip())
    return None


def busbw(size_bytes: float, seconds: float, ranks: int) -> float:
    """Bus bandwidth in GB/s of one all-reduce (nccl-tests: algbw × 2(n−1)/n)."""
    algbw = size_bytes / seconds / 1e9
    return algbw * 2 * (ranks - 1) / ranks


def judge_link(value: Any, reference: Optional[float],
               ratio: float = SLOW_RATIO) -> Dict[str, Any]:
    """The all-reduce figure against the catalog's reference: ``ok``, ``slow`` or ``no
    reference`` (nothing to compare with), ``no figure``."""
    got = number(value)
    ref = number(reference)
    row: Dict[str, Any] = {"busbw_gbps": got, "reference_gbps": ref, "fraction": None,
                           "verdict": "ok", "reason": None}
    if got is None:
        row.update(verdict="no figure", reason=f"the all-reduce gave no figure ({value!r})")
    elif ref is None:
        row["verdict"] = "no reference"
    else:
        row["fraction"] = round(got / ref, 4)
        if got < ratio * ref:
            row.update(verdict="slow", reason=f"all-reduce busbw {fmt(got)} GB/s, "
                       f"{got / ref:.2f}x the reference {fmt(ref)} GB/s")
    return row


def pair_rounds(cards: Sequence[int], rounds: int = 3) -> List[List[Pair]]:
    """Up to ``rounds`` rounds of disjoint pairs (the circle method), each pair once.

    Two rounds already tell which card of a slow pair is to blame (it is slow with two
    different partners); three make it robust to one noisy figure.
    """
    ring: List[Optional[int]] = list(cards)
    if len(ring) < 2:
        return []
    if len(ring) % 2:
        ring.append(None)  # the card paired with None sits the round out
    n = len(ring)
    out: List[List[Pair]] = []
    for _ in range(min(rounds, n - 1)):
        pairs = []
        for k in range(n // 2):
            a, b = ring[k], ring[n - 1 - k]
            if a is not None and b is not None:
                pairs.append((min(a, b), max(a, b)))
        out.append(sorted(pairs))
        ring = [ring[0], ring[-1], *ring[1:-1]]
    return out


def judge_pairs(figures: Mapping[Pair, Any], reference: Optional[float] = None,
                ratio: float = SLOW_RATIO) -> Dict[str, Any]:
    """Slow pairs and the card to blame.

    A pair is slow below ``ratio`` × ``reference`` (a per-pair reference from the catalog)
    or, without one, × the median of all pairs. A pair without a figure is slow. The card
    to blame is the one in *every* slow pair; when the slow pairs share no single card,
    they are named as they are.
    """
    usable = {p: number(v) for p, v in figures.items()}
    good = [v for v in usable.values() if v is not None]
    base = number(reference) or (statistics.median(good) if good else None)
    slow = sorted(p for p, v in usable.items()
                  if v is None or (base is not None and v < ratio * base))
    common = set(slow[0]) if slow else set()
    for pair in slow[1:]:
        common &= set(pair)
    # One slow pair alone cannot tell which of its two cards is to blame.
    card = next(iter(common)) if len(slow) > 1 and len(common) == 1 else None
    return {"base_gbps": base, "slow_pairs": [list(p) for p in slow],
            "card": card,
            "pairs": {f"{a}-{b}": usable[(a, b)] for a, b in sorted(usable)}}


def healthy_cards(cards: Iterable[int], *unhealthy: Iterable[int]) -> List[int]:
    """The cards not named in any of the ``unhealthy`` collections, in order."""
    bad: Set[int] = set()
    for group in unhealthy:
        bad.update(group)
    return sorted(c for c in cards if c not in bad)


HINT_NONE = ("do not run the job on this node: ask the provider for a replacement node (or to "
             "check the cards: nvidia-smi -q -d PERFORMANCE,PCIE,ECC); diagnostics.slow_card: "
             "warn does not help, it only lets a slow card pass when healthy ones are left")


def cards_needed(spec: Any) -> Tuple[int, str]:
    """The healthy cards the run needs on this node and why: one for a pilot, a volume's
    ``cards_per_worker`` (a worker owns that many)."""
    volume = getattr(spec, "volume", None)
    per_worker = int(getattr(volume, "cards_per_worker", 1) or 1) if volume is not None else 1
    if per_worker > 1:
        return per_worker, " (volume.cards_per_worker)"
    return 1, ""


def tolerate_card_verdict(spec: Any, stage: str, result: Dict[str, Any]) -> Dict[str, Any]:
    """A volume goes on with the healthy cards: in a volume's spec, a card stage failed only
    for judging cards (``CARD_VERDICTS``) with healthy cards left passes instead, its
    verdict kept in ``facts["card_verdict"]`` and said in ``facts["warnings"]``.

    The pilot's failure is what the approver overrode ("continue on the healthy cards");
    without this the volume's own ``device`` stage failed again and its driver never ran.
    A several-node volume's card proof reads the same facts (bot/dispatch/card_proof.py).
    Fewer healthy cards than a worker owns (``cards_per_worker``) is no card verdict but the
    node's: the failure becomes ``NoHealthyCard`` (the card proof refuses the node for it).
    Any other result is returned as it is.
    """
    error = result.get("error") or {}
    facts = result.get("facts") or {}
    healthy = facts.get("healthy_cards")
    if (getattr(spec, "volume", None) is None or stage not in CARD_STAGES
            or result.get("status") != "failed" or error.get("type") not in CARD_VERDICTS
            or not isinstance(healthy, list) or not healthy):
        return result
    need, why = cards_needed(spec)
    if len(healthy) < need:
        message = (f"{stage} left {len(healthy)} healthy card(s), the run needs {need}{why}: "
                   f"{error.get('type')}: {error.get('message')}")
        return {**result, "error": {**error, "type": "NoHealthyCard", "message": message,
                                    "hint": HINT_NONE}}
    cards = ", ".join(str(c) for c in healthy)
    warnings = list(facts.get("warnings") or [])
    warnings.append(f"{error.get('type')}: {error.get('message')}: the volume goes on with "
                    f"the healthy card(s) {cards}")
    return {**result, "status": "passed", "error": None,
            "facts": {**facts, "card_verdict": error, "warnings": warnings}}


__all__ = [
    "SLOW_RATIO", "XID_MEANINGS", "number", "card_label", "fmt", "judge_speed",
    "judge_results", "judge_count", "judge_health", "busbw", "judge_link", "pair_rounds",
    "judge_pairs", "healthy_cards", "CARD_STAGES", "CARD_VERDICTS", "tolerate_card_verdict",
    "HINT_NONE", "cards_needed",
]
