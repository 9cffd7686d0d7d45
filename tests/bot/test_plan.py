"""The order summary: decimal money, B200 lots, memory and distribution notes."""

from __future__ import annotations

import json
from decimal import Decimal
from pathlib import Path

import pytest

from bot.pilot.plan import format_usd, make_plan
from tests.bot.manifest_helpers import dump, load, make_project, merged
from tests.bot.runs import run_of


def plan_for(tmp_path: Path, **change: object):  # type: ignore[no-untyped-def]
    make_project(tmp_path)
    return make_plan(load(tmp_path, dump(merged(**change))))


def test_b200_three_lots_seven_days_is_not_multiplied_by_cards(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, hardware={"gpu": "b200", "lots": 3, "days": 7,
                                        "lot_price_usd_per_day": "31.90"})
    assert (plan.gpu, plan.cards_per_lot, plan.total_cards) == ("B200", 2, 6)
    assert plan.total_usd == Decimal("31.90") * 7 * 3 == Decimal("669.90")
    assert plan.formula == "31.90 USD × 7 days × 3 lots = 669.90 USD"
    assert any("not multiplied by the card count" in n for n in plan.notes)


def test_money_is_decimal_not_float(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, hardware={"lot_price_usd_per_day": 0.1, "days": 3, "lots": 1})
    assert plan.total_usd == Decimal("0.3")  # 0.1 * 3 in float is 0.30000000000000004
    assert plan.to_dict()["total_usd"] == "0.30"


@pytest.mark.parametrize("amount, text", [("2.5", "2.50"), ("0.125", "0.125"),
                                          ("7", "7.00"), ("1E+2", "100.00")])
def test_format_usd_never_rounds(amount: str, text: str) -> None:
    assert format_usd(Decimal(amount)) == text


def test_to_dict_has_the_issue_fields(tmp_path: Path) -> None:
    data = plan_for(tmp_path).to_dict()
    for key in ("gpu", "days", "lots", "cards_per_lot", "total_cards", "preparation",
                "lot_price_usd_per_day", "total_usd"):
        assert key in data
    assert json.loads(json.dumps(data)) == data
    assert data["lot_price_usd_per_day"] == "2.50" and data["total_usd"] == "17.50"


def test_memory_is_stated_and_measured_by_the_pilot(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, hardware={"memory_estimate_gib": 30})
    assert plan.memory_per_card_gib == 80 and plan.memory_estimate_gib == 30
    assert any("measured by the pilot" in n and "30 GiB" in n for n in plan.notes)


def test_several_cards_note_unless_distributed(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, hardware={"lots": 2})
    assert any("pool their memory" in n for n in plan.notes)
    plan = plan_for(tmp_path, hardware={"lots": 2}, task={"distributed": True})
    assert not any("pool their memory" in n for n in plan.notes)
    plan = plan_for(tmp_path, hardware={"lots": 1})
    assert not any("pool their memory" in n for n in plan.notes)


def test_lease_window(tmp_path: Path) -> None:
    plan = plan_for(tmp_path, lease={"starts_at": "2030-01-01T09:00:00+00:00"})
    assert plan.ends_at == "2030-01-08T09:00:00+00:00"


def test_the_plan_says_what_the_volume_is_inputs_nodes_and_cards(tmp_path: Path) -> None:
    inputs = {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12}
    none = plan_for(tmp_path)
    assert none.volume is None and none.to_dict()["volume"] is None
    ssh = plan_for(tmp_path, hardware={"gpu": "H100", "lots": 4}, volume={
        "inputs": inputs, "cards_per_worker": 2, "nodes": [
            {"kind": "ssh", "host": "gpu-a.example", "user": "team", "workdir": "/w"},
            {"kind": "ssh", "host": "gpu-b.example", "port": 2222, "workdir": "/w"}]})
    assert ssh.volume == ("12 inputs (data/pilote/doc-*.txt) on 2 nodes: team@gpu-a.example, "
                          "gpu-b.example:2222; 4 cards rented, 2 per worker")
    cpu = plan_for(tmp_path, hardware={"gpu": "cpu", "lot_price_usd_per_day": 0},
                   backend="cpu", volume={"inputs": inputs})
    assert cpu.volume is not None and "12 inputs" in cpu.volume
    assert "this machine (the pilot's node)" in cpu.volume
    from bot.messages.views import plan_message

    shown = plan_message(run_of(id="r-a1", name="demo", attempt=1, plan=ssh.to_dict()))
    pairs = dict(next(b.pairs for b in shown.blocks if hasattr(b, "pairs")))
    assert pairs["Volume (on approval)"] == ssh.volume
