"""The hardware catalog is data: lookups, lots, backends, and a broken file named."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.manifest.catalog import CatalogError, default_catalog, load_catalog


def test_shipped_catalog_models() -> None:
    catalog = default_catalog()
    assert {"H100", "H200", "B200", "MI300X", "A100", "L40S", "cpu"} <= set(catalog.names())
    b200 = catalog.get("b200")
    assert b200 is not None and b200.cards_per_lot == 2
    # a lot holds one card, a B200 lot two (the seed guide); a node-sized offer a node
    assert all(g.cards_per_lot == 1 for g in catalog.gpus
               if g.key != "B200" and not g.lot_is_node)
    assert all(g.cards_per_lot == 8 for g in catalog.gpus if g.lot_is_node)
    mi = catalog.get("MI300X")
    assert mi is not None and mi.backends == ("rocm",) and mi.vendor == "amd"
    assert all(g.backends == ("cuda",) for g in catalog.gpus if g.vendor == "nvidia")
    h100 = catalog.get(" H100-SXM ")
    assert h100 is not None and h100.key == "H100" and h100.bf16_tflops == 989
    cpu = catalog.get("CPU")
    assert cpu is not None and cpu.is_cpu and cpu.memory_gib is None
    assert catalog.get("nope") is None


@pytest.mark.parametrize("text, fragment", [
    ("gpus: [a]", "gpus"),
    ("gpus:\n  X: {vendor: v}\n", "backends"),
    ("gpus:\n  X: {backends: [cuda], cards_per_lot: 0}\n", "cards_per_lot"),
    ("gpus: {X: 3}", "gpus.X"),
    ("gpus:\n  X: {backends: [cuda], allreduce_busbw_gbps: {1: 400}}\n",
     "gpus.X.allreduce_busbw_gbps: card counts must be >= 2"),
    ("gpus:\n  X: {backends: [cuda], allreduce_busbw_gbps: [400]}\n",
     "gpus.X.allreduce_busbw_gbps: expected a mapping"),
    ("{{", "unreadable"),
    ("gpus:\n  X8: {card: X, cards_per_lot: 8}\n", "gpus.X8.card: 'X' is not a card"),
    ("gpus:\n  X: {backends: [cuda]}\n  X8: {card: X, memory_gib: 80}\n",
     "gpus.X8: takes its per-card facts from X; remove memory_gib"),
    ("gpus:\n  X: {backends: [cuda]}\n  X8: {card: X, lot_is_node: yes please}\n",
     "gpus.X8.lot_is_node: expected true or false"),
])
def test_broken_catalog_is_named(tmp_path: Path, text: str, fragment: str) -> None:
    path = tmp_path / "hw.yaml"
    path.write_text(text)
    with pytest.raises(CatalogError, match=fragment):
        load_catalog(path)


def test_card_floors_and_link_references() -> None:
    h200 = default_catalog().get("H200")
    assert h200 is not None and h200.allreduce_busbw_gbps == {8: 475.0}
    assert h200.bf16_floor_tflops is not None and h200.bf16_floor_tflops < h200.bf16_tflops
    l40s = default_catalog().get("L40S")
    assert l40s is not None and l40s.allreduce_busbw_gbps == {}
