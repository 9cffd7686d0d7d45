"""The per-card view of a run: one row per card, the bad ones named, the link's figure.

Built from the facts of the ``device``, ``compute`` and ``interconnect`` stages (see
docs/diagnostics.md): ``facts["cards"]`` maps a card's index (as text) to its row, each
with a ``verdict`` (``ok``, ``slow`` or ``fault``) and its ``reasons``.
"""

from __future__ import annotations

from typing import Any

from bot.messages.model import Heading, Message, Table, Text
from bot.pilot.cards import healthy_cards
from bot.pilot.record import Run

COLUMNS = ("GPU", "name", "bus", "bf16 TFLOP/s", "of peak", "ECC", "PCIe", "verdict")
RANK = {"ok": 0, "slow": 1, "fault": 2}
HINT = ("Ask the provider for a replacement node, or continue on the healthy cards: the "
        "volume runs on those only (diagnostics.slow_card: warn lets a slow card pass as a "
        "warning).")


def cards_message(run: Run, stages: list[dict[str, Any]]) -> Message | None:
    """The card table, or None when the device stage listed no cards (a CPU run)."""
    facts = {row.get("stage"): row.get("facts") or {} for row in stages}
    device = facts.get("device", {}).get("cards")
    if not isinstance(device, dict) or not device:
        return None
    compute = facts.get("compute", {}).get("cards") or {}
    link = facts.get("interconnect", {})
    blamed = (link.get("pairs") or {}).get("card")
    rows, bad = [], []
    for key in sorted(device, key=_index):
        card, perf = device[key] or {}, compute.get(key) or {}
        verdict, reasons = _verdict(card, perf, blamed == _index(key))
        rows.append(_row(key, card, perf, verdict))
        if verdict != "ok":
            label = f"GPU {key} ({card.get('bus_id')})" if card.get("bus_id") else f"GPU {key}"
            bad.append(f"{label}: {'; '.join(reasons)}")
    blocks: list[Any] = [Heading(f"Cards — {run.name}"),
                         Table(COLUMNS, tuple(rows), len(rows))]
    blocks += [Text(line, style="error") for line in bad]
    healthy = healthy_cards(stages)
    if healthy is not None:
        blocks.append(Text(f"Healthy cards: {', '.join(map(str, healthy)) or 'none'} "
                           f"({len(healthy)} of {len(device)})",
                           style="ok" if len(healthy) == len(device) else "warn"))
    line = interconnect_line(link)
    if line:
        blocks.append(Text(line, style="warn" if link.get("link", {}).get("verdict") == "slow"
                           else "plain"))
    if bad:
        blocks.append(Text(HINT, style="muted"))
    summary = f"{run.name}: {len(bad)} bad card(s) of {len(device)}" if bad \
        else f"{run.name}: {len(device)} card(s) ok"
    return Message(run.id, "cards", tuple(blocks), summary=summary)


def interconnect_line(facts: dict[str, Any]) -> str | None:
    """``Interconnect: all-reduce busbw 462 GB/s over 8 cards (nccl), reference 475 GB/s
    (0.97x)``, or None before the stage reported a figure."""
    value = facts.get("busbw_gbps")
    if not isinstance(value, (int, float)):
        return None
    link = facts.get("link") or {}
    text = (f"Interconnect: all-reduce busbw {value:.4g} GB/s over {len(facts.get('cards') or [])}"
            f" cards ({facts.get('library')})")
    ref = link.get("reference_gbps")
    if isinstance(ref, (int, float)):
        return text + f", reference {ref:.4g} GB/s ({value / ref:.2f}x)"
    return text + ", no reference for this model and card count"


def _index(key: Any) -> int:
    try:
        return int(key)
    except (TypeError, ValueError):
        return -1


def _verdict(card: dict[str, Any], perf: dict[str, Any], blamed: bool) -> tuple[str, list[str]]:
    verdict, reasons = "ok", []
    for row in (card, perf):
        word = str(row.get("verdict") or "ok")
        if RANK.get(word, 0) > RANK[verdict]:
            verdict = word
        reasons += [str(r) for r in row.get("reasons") or []]
    if blamed:
        verdict = "fault" if verdict == "fault" else "slow"
        reasons.append("in every slow pair of the interconnect")
    return verdict, reasons


def _row(key: str, card: dict[str, Any], perf: dict[str, Any], verdict: str) -> tuple[str, ...]:
    tflops, frac = perf.get("bf16_tflops"), perf.get("bf16_fraction_of_peak")
    ecc = card.get("ecc_volatile_uncorrected")
    ecc_text = "n/a" if ecc is None else str(ecc)
    if card.get("rows_pending"):
        ecc_text += f", {card['rows_pending']} row(s) pending"
    pcie = card.get("pcie") or {}
    pcie_text = "n/a"
    if pcie.get("width_current") is not None:
        pcie_text = (f"gen{pcie.get('gen_current')}/{pcie.get('gen_max')} "
                     f"x{pcie.get('width_current')}/{pcie.get('width_max')}")
    mark = {"ok": "ok", "slow": "SLOW ⚠", "fault": "FAULT ✗"}.get(verdict, verdict)
    return (key, str(card.get("name") or "?"), str(card.get("bus_id") or "?"),
            f"{tflops:.4g}" if isinstance(tflops, (int, float)) else "–",
            f"{frac:.2f}" if isinstance(frac, (int, float)) else "–", ecc_text, pcie_text, mark)
