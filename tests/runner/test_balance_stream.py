"""The balance stage on large ledgers: streamed, memory-bounded, same columns always."""

from __future__ import annotations

import csv
import json
import tracemalloc
from pathlib import Path
from typing import Any

import pytest

from runner.ledger import Ledger, Row, ledger_path
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages import balance as balance_stage

COLUMNS = ["id", "status", "category", "reason", "output", "input_bytes"]


def setup(tmp: Path, n: int, recorded: range, *, extra: tuple[str, ...] = ()) -> StageContext:
    inp = tmp / "in"
    inp.mkdir()
    for k in range(n):
        (inp / f"i{k:06d}.txt").write_bytes(b"")
    run = tmp / "run"
    run.mkdir()
    with Ledger.open(ledger_path(str(run)), new_attempt=True) as led:
        ids = [f"i{k:06d}" for k in recorded] + list(extra)
        for s in range(0, len(ids), 1000):
            led.record([Row(i, "refused", reason="bad") if i.endswith("7")
                        else Row(i, "accepted", category="a") for i in ids[s:s + 1000]])
    spec = RunSpec.from_dict({
        "run_id": "r", "name": "t",
        "inputs": {"dir": str(inp), "pattern": "*.txt", "expected_count": n},
        "task": {"categories": ["a"]}})
    events: list[tuple[str, dict[str, Any]]] = []
    return StageContext(spec=spec, run_dir=str(run), emit=lambda t, **d: events.append((t, d)))


def csv_rows(ctx: StageContext) -> tuple[list[str], list[dict[str, str]]]:
    with open(Path(ctx.run_dir) / "balance.csv", newline="") as fh:
        reader = csv.DictReader(fh)
        return list(reader.fieldnames or []), list(reader)


def test_an_empty_ledger_still_writes_every_column_and_each_id_missing(tmp_path: Path) -> None:
    ctx = setup(tmp_path, 3, range(0))
    with pytest.raises(StageFailure) as err:
        balance_stage.balance(ctx)
    assert "missing i000000" in str(err.value)
    header, rows = csv_rows(ctx)
    assert header == COLUMNS
    assert [(r["id"], r["status"], r["reason"]) for r in rows] == [
        (f"i{k:06d}", "missing", "never returned") for k in range(3)]


def test_a_ledger_id_no_longer_among_the_inputs_is_invented(tmp_path: Path) -> None:
    ctx = setup(tmp_path, 3, range(3), extra=("a-gone", "zz-gone"))
    with pytest.raises(StageFailure) as err:
        balance_stage.balance(ctx)
    doc = json.loads((Path(ctx.run_dir) / "balance.json").read_text())
    assert [(p["kind"], p["id"]) for p in doc["problems"]] == [
        ("invented", "a-gone"), ("invented", "zz-gone")]
    assert "invented a-gone" in str(err.value)
    assert [r["id"] for r in csv_rows(ctx)[1]] == ["i000000", "i000001", "i000002"]


def test_a_large_balance_is_streamed_within_bounded_memory(tmp_path: Path) -> None:
    n = balance_stage.JSON_ROWS_MAX * 3
    ctx = setup(tmp_path, n, range(n))
    tracemalloc.start()
    try:
        facts = balance_stage.balance(ctx)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert facts["accepted"] + facts["refused"] == n and facts["ok"]
    header, rows = csv_rows(ctx)
    assert header == COLUMNS and len(rows) == n
    assert rows[7] == {"id": "i000007", "status": "refused", "category": "",
                       "reason": "bad", "output": "", "input_bytes": "0"}
    doc = json.loads((Path(ctx.run_dir) / "balance.json").read_text())
    assert doc["rows"] is None and doc["rows_file"] == "balance.csv"
    refused = [s for s in doc["sample"] if s.get("status") == "refused"]
    assert len(refused) == balance_stage.SAMPLE_REFUSED_MAX
    assert "more refused items are not sampled" in doc["sample"][-1]["note"]
    # The input listing itself costs ~350 bytes an item; results held in memory
    # (the former way: rows, dicts, a JSON document) cost several KiB an item.
    assert peak < n * 1000, f"peak {peak} bytes for {n} items"
