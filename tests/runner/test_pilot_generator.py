"""A generator handler in the pilot (runner/stages/batches.py): its results are recorded as
they are yielded, so those before a raise or an interrupt are kept (issue 34)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

from runner.inputs import Item
from runner.itemtimeout import ItemTimedOut
from runner.ledger import Ledger
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages.batches import Batches
from runner.stages.pilot import Recorder
from runner.workloads import WorkloadContext


def _batches(tmp_path: Path, handle: Any) -> tuple[Batches, Ledger, list[Item]]:
    spec = RunSpec.from_dict({"run_id": "r", "name": "n", "inputs": {"dir": str(tmp_path)}})
    ctx = StageContext(spec=spec, run_dir=str(tmp_path), emit=lambda etype, **data: None)
    items = [Item(f"i{n}", str(tmp_path / f"i{n}"), 1) for n in range(6)]
    ledger = Ledger.open(str(tmp_path / "ledger.sqlite"), new_attempt=True)
    recorder = Recorder(ctx, ledger, items, set())
    return Batches(handle, WorkloadContext(spec=spec), recorder, 0), ledger, items


def test_a_generator_handler_s_yields_before_a_raise_are_recorded(tmp_path: Path) -> None:
    def handle(items: list[Item], ctx: Any) -> Iterator[dict[str, Any]]:
        for item in items:
            if item.id == "i4":
                raise ValueError("bad i4")
            yield {"id": item.id, "status": "accepted"}

    batches, ledger, items = _batches(tmp_path, handle)
    batches.batch(items[:3])
    with pytest.raises(StageFailure, match="bad i4"):
        batches.batch(items[3:])
    assert sorted(r.id for r in ledger.rows()) == ["i0", "i1", "i2", "i3"]


def test_an_interrupted_generator_runs_again_only_what_it_had_not_yielded(
        tmp_path: Path) -> None:
    ran: list[str] = []

    def handle(items: list[Item], ctx: Any) -> Iterator[dict[str, Any]]:
        for item in items:
            ran.append(item.id)
            if item.id == "i2":
                raise ItemTimedOut()  # as the item clock interrupts a hung input
            yield {"id": item.id, "status": "accepted"}

    batches, ledger, items = _batches(tmp_path, handle)
    batches.batch(items)
    rows = {r.id: r for r in ledger.rows()}
    assert sorted(rows) == [f"i{n}" for n in range(6)] and rows["i2"].status == "refused"
    assert ran == ["i0", "i1", "i2", "i2", "i3", "i4", "i5"]
