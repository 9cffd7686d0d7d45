"""The pilot, balance and evidence stages, driven in-process through the stage API."""

from __future__ import annotations

import csv
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from runner.events import EventWriter, read_events
from runner.ledger import Ledger
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure, StageSkipped
from runner.stages import balance as balance_stage
from runner.stages import evidence as evidence_stage
from runner.stages import pilot as pilot_stage

HANDLERS = '''
def ok(items, ctx):
    return [{"id": i.id, "status": "refused", "reason": "odd"} if i.id == "i3"
            else {"id": i.id, "status": "accepted", "category": "x",
                  "output": {"len": i.size}} for i in items]
def invents(items, ctx):
    return ok(items, ctx) + [{"id": "ghost", "status": "accepted", "category": "x"}]
def twice(items, ctx):
    out = ok(items, ctx)
    return out + [o for o in out if o["id"] == "i1"]
def drops(items, ctx):
    return [o for o in ok(items, ctx) if o["id"] != "i2"]
def badcat(items, ctx):
    return [dict(o, category="poetry") if o["id"] == "i4" else o for o in ok(items, ctx)]
def boom(items, ctx):
    if any(i.id == "i4" for i in items):
        raise RuntimeError("model exploded")
    return ok(items, ctx)
'''


class Harness:
    """Runs the three stages like the runner does, events into events.jsonl."""

    def __init__(self, tmp: Path, handler: str, *, n: int = 5, copy_to: str | None = None,
                 batch: int = 2) -> None:
        (tmp / "in").mkdir(exist_ok=True)
        for k in range(1, n + 1):
            (tmp / "in" / f"i{k}.txt").write_text("x" * k)
        (tmp / "hmod_l.py").write_text(textwrap.dedent(HANDLERS))
        self.run_dir = tmp / "run"
        self.run_dir.mkdir(exist_ok=True)
        for name in ("manifest.yaml", "spec.json", "environment.json"):
            (self.run_dir / name).write_text("{}\n")
        self.spec = RunSpec.from_dict({
            "run_id": "run-1", "name": "t",
            "project": {"dir": str(tmp)},
            "inputs": {"dir": str(tmp / "in"), "pattern": "*.txt", "expected_count": n,
                       "expected_refusals": ["i3"]},
            "task": {"handler": f"hmod_l:{handler}", "categories": ["x", "y"],
                     "batch_size": batch},
            "results": {"copy_to": copy_to, "sample_per_category": 1, "sample_chars": 3}})
        (self.run_dir / "spec.json").write_text(self.spec.to_json())
        self.events = self.run_dir / "events.jsonl"

    def ctx(self, resume: bool = False) -> tuple[StageContext, EventWriter]:
        writer = (EventWriter.resume if resume else EventWriter)(str(self.events), "run-1")
        ctx = StageContext(spec=self.spec, run_dir=str(self.run_dir), resume=resume,
                           emit=lambda t, **d: writer.emit(t, **d) and None)
        return ctx, writer

    def run(self, *stages: Any, resume: bool = False) -> list[dict[str, Any]]:
        ctx, writer = self.ctx(resume)
        try:
            return [stage(ctx) for stage in stages]
        finally:
            writer.close()

    def typed(self, etype: str) -> list[dict[str, Any]]:
        return [e.to_dict() for e in read_events(str(self.events))[0] if e.type == etype]


@pytest.fixture(autouse=True)
def _forget_handler_module() -> Any:
    yield
    sys.modules.pop("hmod_l", None)


def test_pilot_balance_evidence_end_to_end(tmp_path: Path) -> None:
    h = Harness(tmp_path, "ok", copy_to=str(tmp_path / "ev"))
    pilot, bal, ev = h.run(pilot_stage.pilot, balance_stage.balance, evidence_stage.evidence)
    assert pilot["recorded"] == 5 and pilot["remaining"] == 5
    assert (bal["accepted"], bal["refused"], bal["total"], bal["ok"]) == (4, 1, 5, True)
    done = h.typed("item.done")
    assert sorted(e["id"] for e in done) == ["i1", "i2", "i3", "i4", "i5"]
    # the forecast's measurements: each input's size, and its share of its batch's time
    assert [e["input_bytes"] for e in done] == [1, 2, 3, 4, 5]
    assert all(e["elapsed_s"] >= 0 for e in done)
    assert done[0]["elapsed_s"] == done[1]["elapsed_s"]  # i1 and i2 are one batch of 2
    assert h.typed("progress")[-1]["done"] == 5
    doc = json.loads((h.run_dir / "balance.json").read_text())
    assert [r["id"] for r in doc["rows"]] == ["i1", "i2", "i3", "i4", "i5"]
    # sample review: one accepted per category, every refused one, input head beside it
    assert [(s["id"], s["input_head"]) for s in doc["sample"]] == [("i1", "x"), ("i3", "xxx")]
    rows = list(csv.DictReader((h.run_dir / "balance.csv").read_text().splitlines()))
    assert [(r["id"], r["status"], r["category"], r["reason"]) for r in rows][2] == \
        ("i3", "refused", "", "odd")
    assert json.loads((h.run_dir / "outputs" / "i5.json").read_text()) == {"len": 5}
    assert ev["verified"] is True and (tmp_path / "ev" / "run-1" / "SHA256SUMS").exists()
    assert h.typed("evidence")[0]["verified"] is True


@pytest.mark.parametrize("handler,kind,iid", [
    ("invents", "invented", "ghost"), ("twice", "duplicate", "i1"),
    ("drops", "missing", "i2"), ("badcat", "bad_category", "i4")])
def test_a_misbehaving_task_fails_the_balance_with_the_problem_named(
        tmp_path: Path, handler: str, kind: str, iid: str) -> None:
    h = Harness(tmp_path, handler)
    h.run(pilot_stage.pilot)
    with pytest.raises(StageFailure) as err:
        h.run(balance_stage.balance)
    assert f"{kind} {iid}" in str(err.value)
    event = h.typed("balance")[0]
    assert event["ok"] is False
    assert {"kind": kind, "id": iid} in [{"kind": p["kind"], "id": p["id"]}
                                         for p in event["problems"]]
    assert json.loads((h.run_dir / "balance.json").read_text())["ok"] is False


def test_resume_processes_only_the_remaining_items_and_replays_lost_events(
        tmp_path: Path) -> None:
    h = Harness(tmp_path, "boom")
    with pytest.raises(StageFailure, match="model exploded"):
        h.run(pilot_stage.pilot)  # batches [i1,i2] done, [i3,i4] raised
    with Ledger.open(str(h.run_dir / "ledger.sqlite")) as led:
        assert led.done_ids() == {"i1", "i2"}
    # lose the event of i2, as if the process died between the commit and the emit (the
    # file rewritten one event per line, the form an older runner wrote: read as well)
    kept = [e for e in read_events(str(h.events))[0] if e.data.get("id") != "i2"]
    h.events.write_text("".join(e.to_line() for e in kept))
    h.spec = RunSpec.from_dict({**h.spec.to_dict(),
                                "task": {**h.spec.to_dict()["task"], "handler": "hmod_l:ok"}})
    (facts,) = h.run(pilot_stage.pilot, resume=True)
    assert (facts["already_done"], facts["remaining"], facts["replayed"]) == (2, 3, 1)
    done = h.typed("item.done")
    assert sorted(e["id"] for e in done) == ["i1", "i2", "i3", "i4", "i5"]
    assert [e["id"] for e in done if e.get("replayed")] == ["i2"]
    (again,) = h.run(pilot_stage.pilot, resume=True)
    assert again["note"] == "nothing to do: all 5 items were already done"
    assert len(h.typed("item.done")) == 5


def test_evidence_is_skipped_without_copy_to(tmp_path: Path) -> None:
    h = Harness(tmp_path, "ok")
    h.run(pilot_stage.pilot, balance_stage.balance)
    with pytest.raises(StageSkipped, match="no copy_to in the manifest"):
        h.run(evidence_stage.evidence)


def test_a_bad_handler_reference_fails_the_pilot_with_the_field(tmp_path: Path) -> None:
    h = Harness(tmp_path, "nope")
    with pytest.raises(StageFailure, match="task.handler hmod_l:nope"):
        h.run(pilot_stage.pilot)


def test_a_handler_that_returns_nothing_fails_the_pilot_with_that_cause(tmp_path: Path) -> None:
    (tmp_path / "hmod_none.py").write_text("def handle(items, ctx):\n    return None\n")
    h = Harness(tmp_path, "ok")
    h.spec = RunSpec.from_dict({**h.spec.to_dict(), "task": {
        **h.spec.to_dict()["task"], "handler": "hmod_none:handle"}})
    sys.path.insert(0, str(tmp_path))
    try:
        with pytest.raises(StageFailure, match="no usable result for any of the 5 items") as err:
            h.run(pilot_stage.pilot)
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("hmod_none", None)
    assert err.value.error_type == "NoResults" and err.value.facts["done"] == 0
