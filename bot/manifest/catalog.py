"""The hardware catalog: GPU models, their memory, backends and what a lot holds.

The data lives in ``hardware.yaml`` beside this module so that a new card or a new plan
is a data change. Lookups are case-insensitive and accept the aliases listed there.

An offer can name the ``card`` it holds (``H100x8: {card: H100, cards_per_lot: 8,
lot_is_node: true}``): it takes that card's per-card facts (memory, backends, peaks,
floor, all-reduce reference) from the card's own entry, so they are written once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from bot.errors import PreflightError

CATALOG_PATH = Path(__file__).with_name("hardware.yaml")


class CatalogError(PreflightError):
    """The catalog file itself is broken (names the entry and the field)."""


@dataclass(frozen=True)
class GpuModel:
    key: str
    vendor: str
    memory_gib: float | None
    cards_per_lot: int
    backends: tuple[str, ...]
    bf16_tflops: float | None = None
    fp32_tflops: float | None = None
    note: str | None = None
    aliases: tuple[str, ...] = ()
    bf16_floor_tflops: float | None = None
    allreduce_busbw_gbps: dict[int, float] = field(default_factory=dict)
    card: str = ""  # the card model a lot holds (what the runner looks for); "" = key
    lot_is_node: bool = False  # a lot is one whole node: N lots are N nodes

    def __post_init__(self) -> None:
        if not self.card:
            object.__setattr__(self, "card", self.key)

    @property
    def is_cpu(self) -> bool:
        return self.vendor == "none"


@dataclass(frozen=True)
class Catalog:
    gpus: tuple[GpuModel, ...]
    _index: dict[str, GpuModel] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        for gpu in self.gpus:
            for name in (gpu.key, *gpu.aliases):
                self._index[name.lower()] = gpu

    def get(self, name: str) -> GpuModel | None:
        """The model named ``name`` (case-insensitive, aliases accepted), or None."""
        return self._index.get(name.strip().lower())

    def names(self) -> list[str]:
        return [gpu.key for gpu in self.gpus]


def load_catalog(path: Path | str | None = None) -> Catalog:
    """Read a catalog file; raise CatalogError naming the entry when it is malformed."""
    source = Path(path) if path is not None else CATALOG_PATH
    try:
        raw = yaml.safe_load(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise CatalogError(f"hardware catalog {source}: unreadable: {exc}") from exc
    if not isinstance(raw, dict) or not isinstance(raw.get("gpus"), dict):
        raise CatalogError(f"hardware catalog {source}: expected a mapping with 'gpus'")
    try:
        entries = {str(k): v for k, v in raw["gpus"].items()}
        cards = {k: _parse_gpu(k, v) for k, v in entries.items()
                 if not (isinstance(v, dict) and "card" in v)}
        return Catalog(gpus=tuple(cards[k] if k in cards else _parse_offer(k, v, cards)
                                  for k, v in entries.items()))
    except (TypeError, ValueError, KeyError) as exc:
        raise CatalogError(f"hardware catalog {source}: {exc}") from exc


def _parse_gpu(key: str, entry: Any) -> GpuModel:
    if not isinstance(entry, dict):
        raise ValueError(f"gpus.{key}: expected a mapping")
    try:
        backends = tuple(str(b) for b in entry["backends"])
        cards = int(entry.get("cards_per_lot", 1))
    except KeyError as exc:
        raise ValueError(f"gpus.{key}: missing {exc.args[0]!r}") from exc
    if cards < 1 or not backends:
        raise ValueError(f"gpus.{key}: cards_per_lot must be >= 1 and backends non-empty")
    return GpuModel(
        key=key,
        vendor=str(entry.get("vendor", "unknown")),
        memory_gib=_opt_float(entry.get("memory_gib")),
        cards_per_lot=cards,
        backends=backends,
        bf16_tflops=_opt_float(entry.get("bf16_tflops")),
        fp32_tflops=_opt_float(entry.get("fp32_tflops")),
        note=entry.get("note"),
        aliases=tuple(str(a) for a in entry.get("aliases", ())),
        bf16_floor_tflops=_opt_float(entry.get("bf16_floor_tflops")),
        allreduce_busbw_gbps=_busbw(key, entry.get("allreduce_busbw_gbps")),
        lot_is_node=_flag(key, entry.get("lot_is_node", False)),
    )


# The facts of one card: an offer that names its card takes them from the card's entry.
CARD_FACTS = ("vendor", "memory_gib", "backends", "bf16_tflops", "fp32_tflops",
              "bf16_floor_tflops", "allreduce_busbw_gbps")


def _parse_offer(key: str, entry: dict[str, Any], cards: dict[str, GpuModel]) -> GpuModel:
    """An offer of several cards of one model (``card``): that card's facts, its own lot."""
    card = cards.get(str(entry["card"]))
    if card is None:
        raise ValueError(f"gpus.{key}.card: {entry['card']!r} is not a card entry of the "
                         f"catalog (one without a card of its own)")
    copied = sorted(set(CARD_FACTS) & set(entry))
    if copied:
        raise ValueError(f"gpus.{key}: takes its per-card facts from {card.key}; remove "
                         f"{', '.join(copied)}")
    lots = int(entry.get("cards_per_lot", 1))
    if lots < 1:
        raise ValueError(f"gpus.{key}: cards_per_lot must be >= 1")
    return GpuModel(
        key=key, vendor=card.vendor, memory_gib=card.memory_gib, cards_per_lot=lots,
        backends=card.backends, bf16_tflops=card.bf16_tflops, fp32_tflops=card.fp32_tflops,
        note=entry.get("note"), aliases=tuple(str(a) for a in entry.get("aliases", ())),
        bf16_floor_tflops=card.bf16_floor_tflops,
        allreduce_busbw_gbps=dict(card.allreduce_busbw_gbps), card=card.key,
        lot_is_node=_flag(key, entry.get("lot_is_node", False)))


def _flag(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise ValueError(f"gpus.{key}.lot_is_node: expected true or false")
    return value


def _busbw(key: str, raw: Any) -> dict[int, float]:
    """``{cards: GB/s}``; every card count at least 2 and every figure positive."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ValueError(f"gpus.{key}.allreduce_busbw_gbps: expected a mapping of card "
                         f"count to GB/s")
    out = {int(cards): float(gbps) for cards, gbps in raw.items()}
    if any(cards < 2 or gbps <= 0 for cards, gbps in out.items()):
        raise ValueError(f"gpus.{key}.allreduce_busbw_gbps: card counts must be >= 2 and "
                         f"figures > 0")
    return out


def _opt_float(value: Any) -> float | None:
    return None if value is None else float(value)


@lru_cache(maxsize=1)
def default_catalog() -> Catalog:
    """The catalog shipped with the package (read once)."""
    return load_catalog()
