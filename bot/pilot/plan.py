"""The order summary of a pilot: what is rented, for how long, and what it costs.

Money is Decimal end to end and never rounded: total = lot price x days x lots. A lot's
price already covers every card in it (a B200 lot holds two), so the card count never
enters the total. The plan also says what it cannot know: the memory peak is measured by
the pilot, and several cards neither distribute a program nor pool their memory.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import timedelta
from decimal import Decimal
from typing import Any

from bot.errors import PreflightError
from bot.manifest.catalog import Catalog, GpuModel, default_catalog
from bot.manifest.load import LoadedManifest
from bot.manifest.model import Manifest
from bot.pilot.fetch_caps import FetchCaps, expected_evidence, volume_caps

CENT = Decimal("0.01")


@dataclass(frozen=True)
class Plan:
    gpu: str
    vendor: str
    days: int
    lots: int
    cards_per_lot: int
    total_cards: int
    preparation: str
    backend: str
    lot_price_usd_per_day: Decimal
    total_usd: Decimal
    formula: str
    memory_per_card_gib: float | None
    memory_estimate_gib: float | None
    notes: tuple[str, ...]
    starts_at: str | None = None
    ends_at: str | None = None
    bf16_tflops: float | None = None  # the catalog's per-card peaks, where it knows them
    fp32_tflops: float | None = None
    bf16_floor_tflops: float | None = None  # a card below it is slow (runner.cards)
    allreduce_busbw_gbps: dict[int, float] = field(default_factory=dict)  # by card count
    volume: str | None = None  # what an approval launches: inputs, nodes, cards (or None)
    fetch: str | None = None  # the results fetch's caps, for the pilot and the volume

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, with the issue's field names; money as exact decimal strings."""
        return {
            "gpu": self.gpu, "vendor": self.vendor, "days": self.days, "lots": self.lots,
            "cards_per_lot": self.cards_per_lot, "total_cards": self.total_cards,
            "preparation": self.preparation, "backend": self.backend,
            "lot_price_usd_per_day": format_usd(self.lot_price_usd_per_day),
            "total_usd": format_usd(self.total_usd), "formula": self.formula,
            "memory_per_card_gib": self.memory_per_card_gib,
            "memory_estimate_gib": self.memory_estimate_gib, "notes": list(self.notes),
            "starts_at": self.starts_at, "ends_at": self.ends_at,
            "bf16_tflops": self.bf16_tflops, "fp32_tflops": self.fp32_tflops,
            "bf16_floor_tflops": self.bf16_floor_tflops,
            "allreduce_busbw_gbps": {str(k): v for k, v in self.allreduce_busbw_gbps.items()},
            "volume": self.volume, "fetch": self.fetch,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Plan:
        """The plan ``to_dict`` wrote (as the store holds it); KeyError, ValueError or
        TypeError when it does not hold one. Fields added since an old run was planned
        take their defaults."""
        busbw = data.get("allreduce_busbw_gbps") or {}
        return cls(
            gpu=str(data["gpu"]), vendor=str(data["vendor"]), days=int(data["days"]),
            lots=int(data["lots"]), cards_per_lot=int(data["cards_per_lot"]),
            total_cards=int(data["total_cards"]), preparation=str(data["preparation"]),
            backend=str(data["backend"]),
            lot_price_usd_per_day=Decimal(str(data["lot_price_usd_per_day"])),
            total_usd=Decimal(str(data["total_usd"])), formula=str(data["formula"]),
            memory_per_card_gib=_number(data.get("memory_per_card_gib")),
            memory_estimate_gib=_number(data.get("memory_estimate_gib")),
            notes=tuple(str(n) for n in data.get("notes") or ()),
            starts_at=data.get("starts_at"), ends_at=data.get("ends_at"),
            bf16_tflops=_number(data.get("bf16_tflops")),
            fp32_tflops=_number(data.get("fp32_tflops")),
            bf16_floor_tflops=_number(data.get("bf16_floor_tflops")),
            allreduce_busbw_gbps={int(k): float(v) for k, v in dict(busbw).items()},
            volume=data.get("volume"), fetch=data.get("fetch"))


def _number(value: Any) -> float | None:
    """A stored figure as it was written (an int stays an int: "80 GiB", not "80.0 GiB")."""
    if value is None or isinstance(value, (int, float)) and not isinstance(value, bool):
        return value
    return float(value)


def format_usd(amount: Decimal) -> str:
    """At least two decimals, never rounded: 2.5 -> "2.50", 0.125 -> "0.125"."""
    if amount.as_tuple().exponent >= -2:  # type: ignore[operator]
        amount = amount.quantize(CENT)
    return f"{amount:f}"


def plural(count: int, word: str) -> str:
    """``plural(1, "lot")`` -> "1 lot", ``plural(3, "lot")`` -> "3 lots"."""
    return f"{count} {word}{'' if count == 1 else 's'}"


def describe_lots(lots: int, cards_per_lot: int, total_cards: int) -> str:
    """"3 lots × 2 cards per lot = 6 cards" (the card count a buyer gets, not a price)."""
    return (f"{plural(lots, 'lot')} × {plural(cards_per_lot, 'card')} per lot = "
            f"{plural(total_cards, 'card')}")


def describe_price(price: str, gpu: str, cards_per_lot: int) -> str:
    """The lot price, saying what one lot covers when it holds several cards."""
    if cards_per_lot == 1:
        return f"{price} USD"
    return f"{price} USD (one {gpu} lot = {cards_per_lot} cards, all covered by this price)"


def make_plan(loaded: LoadedManifest, catalog: Catalog | None = None,
              caps: FetchCaps | None = None, forecast: Mapping[str, Any] | None = None) -> Plan:
    """The order summary of a validated manifest; ``caps``: the bot host's fetch caps
    (its settings), sized here for the pilot and the volume (``forecast``: the pilot's,
    for a volume: its bytes cap sized from the expected evidence)."""
    manifest = loaded.manifest
    hardware = manifest.hardware
    gpu = (catalog or default_catalog()).get(hardware.gpu)
    if gpu is None:
        raise PreflightError(f"hardware.gpu: {hardware.gpu!r} is not in the catalog")
    price = hardware.lot_price_usd_per_day
    total = price * hardware.days * hardware.lots
    formula = (f"{format_usd(price)} USD × {plural(hardware.days, 'day')} × "
               f"{plural(hardware.lots, 'lot')} = {format_usd(total)} USD")
    total_cards = gpu.cards_per_lot * hardware.lots
    starts = manifest.lease.starts_at
    return Plan(
        gpu=gpu.key, vendor=gpu.vendor, days=hardware.days, lots=hardware.lots,
        cards_per_lot=gpu.cards_per_lot, total_cards=total_cards,
        preparation=manifest.preparation, backend=manifest.backend,
        lot_price_usd_per_day=price, total_usd=total, formula=formula,
        memory_per_card_gib=gpu.memory_gib, memory_estimate_gib=hardware.memory_estimate_gib,
        notes=tuple(_notes(loaded, gpu, total_cards)),
        starts_at=starts.isoformat() if starts else None,
        ends_at=(starts + timedelta(days=hardware.days)).isoformat() if starts else None,
        bf16_tflops=gpu.bf16_tflops, fp32_tflops=gpu.fp32_tflops,
        bf16_floor_tflops=gpu.bf16_floor_tflops,
        allreduce_busbw_gbps=dict(gpu.allreduce_busbw_gbps),
        volume=describe_volume(manifest, gpu.key, total_cards),
        fetch=describe_fetch(manifest, caps or FetchCaps(), forecast),
    )


def describe_fetch(manifest: Manifest, caps: FetchCaps,
                   forecast: Mapping[str, Any] | None = None) -> str:
    """The results fetch's caps for the pilot and the volume, in one line ("pilot: up
    to 1,048 files, 4.00 GiB in all, 2.00 GiB per file; volume: ..."). The volume's
    bytes are sized from the pilot's forecast when there is one; before the pilot, the
    line says they will be."""
    out = f"pilot: {caps.for_inputs(manifest.inputs.expected_count).words()}"
    if manifest.volume is not None:
        volume, _how = volume_caps(caps, manifest.volume.inputs.expected_count, forecast)
        sized = expected_evidence(forecast) is not None
        out += (f"; volume: {volume.words()}"
                + (" (bytes sized from the pilot's evidence copy)" if sized else
                   " (at most: its bytes are sized after the pilot, from its evidence copy)"))
    return out


def describe_volume(manifest: Manifest, gpu: str, total_cards: int) -> str | None:
    """What an approval would launch, in one line: "12 inputs (corpus/*.txt) on this
    machine (the pilot's node), 1 card, 1 per worker"; None without a volume."""
    volume = manifest.volume
    if volume is None:
        return None
    inputs = volume.inputs
    folder = inputs.dir.rstrip('/') if inputs.dir else f"{inputs.on_nodes} on the nodes"
    what = (f"{inputs.expected_count} inputs ({folder}/{inputs.pattern}"
            + (f", frames {inputs.frames}" if inputs.frames is not None else "") + ")")
    listed = volume.nodes if isinstance(volume.nodes, list) and volume.nodes else None
    nodes = [n.words for n in listed] if listed else [
        manifest.node.words + " (the pilot's node)"]
    where = ", ".join(nodes) if len(nodes) <= 4 else f"{', '.join(nodes[:4])} and " \
        f"{len(nodes) - 4} more"
    if gpu == "cpu":
        return f"{what} on {where}, CPU workers"
    per_worker = volume.cards_per_worker
    return (f"{what} on {plural(len(nodes), 'node')}: {where}; {plural(total_cards, 'card')} "
            f"rented, {per_worker} per worker")


def _notes(loaded: LoadedManifest, gpu: GpuModel, total_cards: int) -> list[str]:
    manifest = loaded.manifest
    memory = gpu.memory_gib
    estimate = manifest.hardware.memory_estimate_gib
    notes: list[str] = []
    if memory is None and manifest.preparation == "blender":
        notes.append("no accelerator: the memory stage reads the first frame's peak from "
                     "Cycles' log, rendered on the CPU")
    elif memory is None:
        notes.append("no accelerator: the memory stage measures the process peak on the CPU")
    else:
        declared = (f"declared estimate {estimate:g} GiB per card" if estimate is not None
                    else "no estimate declared")
        notes.append(f"memory: {memory:g} GiB per card, {declared}; the peak is measured by "
                     "the pilot, never inferred from a parameter count")
    lots = manifest.hardware.lots
    if gpu.lot_is_node:
        notes.append(f"one {gpu.key} lot is one node of {gpu.cards_per_lot} {gpu.card} cards "
                     f"and its price covers the whole node: the total is not multiplied by "
                     f"the card count; {plural(lots, 'lot')} {'are' if lots > 1 else 'is'} "
                     f"{plural(lots, 'node')}, each proving its own {gpu.cards_per_lot} cards")
    elif gpu.cards_per_lot > 1:
        notes.append(f"a {gpu.key} lot holds {gpu.cards_per_lot} cards and its price covers "
                     "them all: the total is not multiplied by the card count")
    if total_cards > 1 and not manifest.task.distributed:
        notes.append(f"{total_cards} cards: several cards neither distribute a program nor "
                     "pool their memory; the task declares no distribution "
                     "(task.distributed: false), so it uses one card unless the program "
                     "distributes itself")
    node = loaded.manifest.node
    if not node.is_remote and not node.python:
        notes.append("node.python is not set: the local runner uses Preflight's own interpreter "
                      "(PREFLIGHT_RUNNER_PYTHON, else the one running preflight); set "
                      "node.python to check the interpreter your project runs with")
    notes.append("'I have paid' records a notification: it confirms neither receipt of funds "
                 "nor that the machine is available; follow the access details actually sent")
    return notes
