"""Every card of the node in the device stage: torch's view joined with the vendor's.

torch gives the cards this process may use (after ``CUDA_VISIBLE_DEVICES``), in its own
index order; NVML / nvidia-smi / amd-smi give the health facts of every card of the node,
in PCI order. They are joined on the UUID, else the bus id, else the position (only when
nothing hides a card). Each card gets a verdict from runner.cards.judge_health; the
count is judged against the cards rented on this node: its share of the rent
(``HardwareSpec.expected_cards``, ``runner.spec.node_share``), the same rule the bot uses for
the pilot, each volume node's card proof and the volume's head.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from runner.cards import (
    HINT_NONE,
    card_label,
    cards_needed,
    fmt,
    healthy_cards,
    judge_count,
    judge_health,
    number,
)
from runner.stage import StageContext, StageFailure

GIB = 1024 ** 3
HINT_FAULT = ("ask the provider for a replacement node (or a replacement card); or approve "
              "with an override to continue on the healthy cards, which the volume will do")
HINT_SLOW = ("ask the provider to check the card (nvidia-smi -q -d PERFORMANCE,PCIE) or for "
             "a replacement node; or set diagnostics.slow_card: warn to continue on the "
             "healthy cards, which the volume will do")


def torch_card(torch: Any, index: int) -> Dict[str, Any]:
    """What torch knows of card ``index`` (the device stage's ``devices`` row)."""
    props = torch.cuda.get_device_properties(index)
    row: Dict[str, Any] = {"index": index, "name": props.name,
                           "memory_gib": round(props.total_memory / GIB, 2),
                           "multiprocessors": getattr(props, "multi_processor_count", None)}
    uuid = getattr(props, "uuid", None)
    if uuid is not None:
        text = str(uuid)
        row["uuid"] = text if text.startswith("GPU-") else f"GPU-{text}"
    if getattr(props, "pci_bus_id", None) is not None:
        row["bus_id"] = (f"{int(getattr(props, 'pci_domain_id', 0)):04x}:"
                         f"{int(props.pci_bus_id):02x}:{int(props.pci_device_id):02x}.0")
    # a ROCm build's cards have a gfx target; a CUDA build's a compute capability (recent
    # CUDA builds also carry gcnArchName, the card's name: seen on an H200, torch 2.11)
    if getattr(getattr(torch, "version", None), "hip", None):
        row["gfx_arch"] = getattr(props, "gcnArchName", None) or None
    else:
        row["capability"] = f"{props.major}.{props.minor}"
    return row


def join_cards(seen: List[Dict[str, Any]], vendor: List[Dict[str, Any]],
               visible: Optional[str]) -> Dict[str, Dict[str, Any]]:
    """torch's rows completed with the vendor's facts, keyed by torch index (as text)."""
    by_uuid = {str(v.get("uuid")).lower(): v for v in vendor if v.get("uuid")}
    by_bus = {v.get("bus_id"): v for v in vendor if v.get("bus_id")}
    positional = visible is None and len(vendor) == len(seen)
    out: Dict[str, Dict[str, Any]] = {}
    for pos, row in enumerate(seen):
        match = by_uuid.get(str(row.get("uuid")).lower()) or by_bus.get(row.get("bus_id"))
        if match is None and positional:
            match = vendor[pos]
        merged = {**(match or {}), **{k: v for k, v in row.items() if v is not None}}
        if match is not None:
            merged["vendor_index"] = match.get("index")
            merged["index"] = row["index"]
        out[str(row["index"])] = merged
    return out


def judge_cards(ctx: StageContext, cards: Dict[str, Dict[str, Any]],
                facts: Dict[str, Any]) -> None:
    """Verdict per card, the count against the rent, ``healthy_cards``; fail when due."""
    hw = ctx.spec.hardware
    faults, slow = [], []
    for key, card in cards.items():
        bad, slower, notes = judge_health(card)
        card["verdict"] = "fault" if bad else "slow" if slower else "ok"
        card["reasons"], card["notes"] = bad + slower, notes
        label = card_label(int(key), card.get("bus_id"))
        faults += [f"{label}: {r}" for r in bad]
        slow += [f"{label}: {r}" for r in slower]
    facts["healthy_cards"] = healthy_cards(
        (int(k) for k in cards), (int(k) for k, c in cards.items() if c["verdict"] != "ok"))
    facts["rented_cards"] = hw.expected_cards()  # this node's share of the rent
    level, count_msg = judge_count(len(cards), hw)
    if level == "warn" and count_msg:
        facts["warnings"].append(count_msg)
    if level == "fail" and count_msg:
        raise StageFailure("device", count_msg, facts=facts, error_type="TooFewDevices",
                           hint="check CUDA_VISIBLE_DEVICES, that every card shows in "
                                "nvidia-smi / amd-smi, and that the node is the one ordered; "
                                "a card that fell off the bus needs the provider")
    require_healthy(ctx, "device", cards, facts)
    if faults:
        raise StageFailure("device", "; ".join(faults), facts=facts, error_type="CardFault",
                           hint=HINT_FAULT)
    if slow:
        report_slow(ctx, "device", slow, facts)


def require_healthy(ctx: StageContext, stage: str, cards: Dict[str, Dict[str, Any]],
                    facts: Dict[str, Any], bus: Optional[Dict[int, Any]] = None) -> None:
    """Fail ``stage`` (``NoHealthyCard``) when it left fewer healthy cards than the run
    needs, whatever ``diagnostics.slow_card`` says: warn lets a slow card pass among
    healthy ones, never a node with none to run on. Names every card's verdict."""
    healthy = facts.get("healthy_cards")
    if not isinstance(healthy, list):
        return
    need, why = cards_needed(ctx.spec)
    if len(healthy) >= need:
        return
    rows = []
    for key, card in sorted(cards.items(), key=lambda kv: int(kv[0])):
        label = card_label(int(key), (bus or {}).get(int(key), card.get("bus_id")))
        reasons = card.get("reasons") or []
        figure = number(card.get("bf16_tflops"))
        rows.append(f"{label}: {'; '.join(map(str, reasons))}" if reasons
                    else f"{label}: ok" + (f", bf16 matmul {fmt(figure)} TFLOP/s"
                                           if figure is not None else ""))
    raise StageFailure(stage, f"{stage} left {len(healthy)} healthy card(s) of {len(cards)}, "
                              f"the run needs {need}{why}: " + "; ".join(rows),
                       facts=facts, error_type="NoHealthyCard", hint=HINT_NONE)


def report_slow(ctx: StageContext, stage: str, lines: List[str], facts: Dict[str, Any]) -> None:
    """Slow cards fail ``stage`` (``SlowCard``), or are warnings with ``slow_card: warn``."""
    if ctx.spec.diagnostics.slow_card == "warn":
        facts.setdefault("warnings", []).extend(lines)
        return
    raise StageFailure(stage, "; ".join(lines), facts=facts, error_type="SlowCard",
                       hint=HINT_SLOW)


def gpu_cards(ctx: StageContext, seen: List[Dict[str, Any]], facts: Dict[str, Any]) -> None:
    """The device stage on a GPU node: every card torch ``seen`` joined with the vendor's
    facts, its health, the count against the rent, the verdicts."""
    from runner.stages.smi import card_facts

    vendor = card_facts(ctx.spec.backend)
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    cards = join_cards(seen, vendor["cards"], visible)
    facts.update(cards=cards, card_source=vendor["source"] or "torch only",
                 cuda_visible_devices=visible, xid_source=vendor.get("xid_source"))
    if vendor.get("nvml"):
        facts["nvml"] = vendor["nvml"]
    judge_cards(ctx, cards, facts)


__all__ = ["torch_card", "join_cards", "judge_cards", "gpu_cards", "report_slow", "HINT_SLOW",
           "cards_needed", "require_healthy"]
