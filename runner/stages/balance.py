"""The balance stage: the balance recomputed from the ledger, written to balance.json and
balance.csv with the sample review; the stage fails when the balance is not ok.
Standard library only at import time.
"""

from __future__ import annotations

import csv
import os
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from runner.balance import Balance, Problem, Tally, compute_balance
from runner.files import atomic_open, write_json_atomic
from runner.inputs import Item
from runner.ledger import Anomaly, LedgerError, Row, ledger_path
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages.pilot import list_stage_inputs, open_ledger

EVENT_SAMPLE_REFUSED_MAX = 100
EVENT_PROBLEMS_MAX = 200       # the balance event names this many; balance.json has all
SAMPLE_REFUSED_MAX = 1000      # refused items sampled with their input; the csv has all
JSON_ROWS_MAX = 10_000          # above this, the per-id rows are in balance.csv only


def balance(ctx: StageContext) -> Dict[str, Any]:
    """Balance from the ledger; writes balance.json and balance.csv; fails when not ok.

    The ledger is streamed in id order beside the sorted inputs, and balance.csv is
    written row by row, so a run of a million items never holds its results in memory.
    """
    spec = ctx.spec
    items = list_stage_inputs(spec, "balance")
    if not os.path.exists(ledger_path(ctx.run_dir)):
        raise StageFailure("balance", "no ledger.sqlite in the run directory",
                           hint="the pilot stage did not record anything")
    ledger = open_ledger(ctx, "balance")
    csv_path = os.path.join(ctx.run_dir, "balance.csv")
    try:
        pending = ledger.forgotten_ids()  # forgotten, not run again yet
        with atomic_open(csv_path) as fh:
            bal, sample, rows = _stream_balance(spec, items, ledger.rows(), fh, pending)
        for a in ledger.anomalies():
            bal.problems.append(Problem(a.kind, a.id, a.detail))
        forgotten = ledger.forgotten()
        if forgotten:  # their inputs are missing until a resume runs them again
            bal.warnings.insert(0, Problem("outputs_lost", None, (  # first: never capped off
                f"{forgotten:,} ledger row(s) forgotten because their outputs were lost by "
                f"the node that wrote them (lost_outputs.jsonl; the ledger's forgotten "
                f"table): their inputs are run again by a resume")))
    except LedgerError as exc:
        raise StageFailure("balance", str(exc), hint="check the run directory") from exc
    finally:
        ledger.close()
    doc = bal.to_dict()
    doc.update({"run": spec.run_id, "rows": rows, "sample": sample,
                "expected_refusals": list(spec.inputs.expected_refusals),
                "categories": _categories(spec)})
    if rows is None:
        doc["rows_file"] = "balance.csv"
    write_json_atomic(os.path.join(ctx.run_dir, "balance.json"), doc)
    event = bal.to_dict()
    event["sample"] = _event_sample(sample)
    if pending:  # the item events still count them: the bot's recount is told why
        event["forgotten_pending"] = len(pending)
    for key in ("problems", "warnings"):
        if len(event[key]) > EVENT_PROBLEMS_MAX:
            event[f"{key}_count"] = len(event[key])
            event[key] = event[key][:EVENT_PROBLEMS_MAX]
    ctx.emit("balance", **event)
    facts = {k: doc[k] for k in ("accepted", "refused", "total", "ok", "by_category")}
    facts["problems"] = len(bal.problems)
    if not bal.ok:
        raise StageFailure("balance", bal.summary(), facts=facts,
                           hint="each problem names the input id; see balance.json")
    return facts


def _categories(spec: RunSpec) -> List[str]:
    cats = list(spec.task.categories or [])
    return cats or (["train"] if spec.task.kind == "train" else [])


CSV_COLUMNS = ["id", "status", "category", "reason", "output", "input_bytes"]


def _stream_balance(spec: RunSpec, items: List[Item], rows: Iterable[Row],
                    out: Any, forgotten: Optional[Set[str]] = None,
                    ) -> Tuple[Balance, List[Dict[str, Any]], Optional[List[Dict[str, Any]]]]:
    """One pass over the inputs (sorted by id) and the ledger rows (sorted by id).

    Writes one balance.csv line per input (``missing`` for an id the ledger lacks), judges
    each id with the shared rules, and keeps only the sample review and, for a run of at
    most JSON_ROWS_MAX inputs, the rows for balance.json. A ledger id that is not among
    the inputs (the inputs changed between attempts) is an ``invented`` problem.
    """
    tally = Tally(spec.inputs.expected_refusals, _categories(spec), keep_rows=False,
                  forgotten=forgotten)
    writer = csv.DictWriter(out, fieldnames=CSV_COLUMNS, lineterminator="\n")
    writer.writeheader()
    sampler = _Sampler(spec)
    kept: Optional[List[Dict[str, Any]]] = [] if len(items) <= JSON_ROWS_MAX else None
    ledger_rows = iter(rows)
    row = next(ledger_rows, None)
    for it in items:
        while row is not None and row.id < it.id:
            tally.problems.append(Problem("invented", row.id, "in the ledger but not among "
                                                              "the inputs"))
            row = next(ledger_rows, None)
        found = row if row is not None and row.id == it.id else None
        if found is not None:
            row = next(ledger_rows, None)
        tally.judge(it.id, found.to_result() if found else None)
        line = _csv_row(it, found)
        writer.writerow({c: "" if line.get(c) is None else line.get(c) for c in CSV_COLUMNS})
        if kept is not None:
            kept.append(line)
        if found is not None:
            sampler.offer(found, it.path)
    while row is not None:
        tally.problems.append(Problem("invented", row.id, "in the ledger but not among the "
                                                          "inputs"))
        row = next(ledger_rows, None)
    bal = tally.finish(spec.inputs.expected_count or None)
    return bal, sampler.done(), kept


def _csv_row(it: Item, row: Optional[Row]) -> Dict[str, Any]:
    if row is None:
        return {"id": it.id, "status": "missing", "category": None,
                "reason": "never returned", "output": None, "input_bytes": it.size}
    return {"id": it.id, "status": row.status, "category": row.category,
            "reason": row.reason, "output": row.output, "input_bytes": it.size}


class _Sampler:
    """A few accepted items per category and the refused ones, beside their input."""

    def __init__(self, spec: RunSpec) -> None:
        self.per_cat = max(0, int(spec.results.sample_per_category))
        self.chars = max(0, int(spec.results.sample_chars))
        self.taken: Dict[str, int] = {}
        self.sample: List[Dict[str, Any]] = []
        self.refused_taken = 0
        self.refused_left_out = 0

    def offer(self, row: Row, path: Optional[str]) -> None:
        if row.status == "accepted":
            key = str(row.category)
            if self.taken.get(key, 0) >= self.per_cat:
                return
            self.taken[key] = self.taken.get(key, 0) + 1
        elif self.refused_taken >= SAMPLE_REFUSED_MAX:
            self.refused_left_out += 1
            return
        else:
            self.refused_taken += 1
        entry = row.to_result()
        entry["input_head"] = _head(path, self.chars)
        self.sample.append(entry)

    def done(self) -> List[Dict[str, Any]]:
        if self.refused_left_out:
            self.sample.append({"note": f"{self.refused_left_out} more refused items are not "
                                        f"sampled; balance.csv lists each with its reason"})
        return self.sample


def balance_from_rows(spec: RunSpec, items: List[Item], rows: List[Row],
                      anomalies: List[Anomaly]) -> Balance:
    """The balance of in-memory rows (the streamed stage gives the same answer)."""
    bal = compute_balance([it.id for it in items], spec.inputs.expected_refusals,
                          _categories(spec), [r.to_result() for r in rows],
                          expected_count=spec.inputs.expected_count or None)
    for a in anomalies:
        bal.problems.append(Problem(a.kind, a.id, a.detail))
    return bal


def sample_review(spec: RunSpec, items: List[Item], rows: List[Row]) -> List[Dict[str, Any]]:
    """A few accepted items per category and every refused one, beside their input."""
    paths = {it.id: it.path for it in items}
    sampler = _Sampler(spec)
    for row in rows:
        sampler.offer(row, paths.get(row.id))
    return sampler.done()


def _head(path: Optional[str], chars: int) -> Optional[str]:
    if path is None:
        return None
    try:
        with open(path, "rb") as fh:
            data = fh.read(chars * 4 + 4)
    except OSError as exc:
        return f"(unreadable: {exc.strerror or exc})"
    if b"\x00" in data:  # a .blend, an image: its bytes mean nothing to a reader
        return f"(binary file {os.path.basename(path)}, {os.path.getsize(path)} bytes)"
    return data.decode("utf-8", errors="replace")[:chars]


def _event_sample(sample: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    refused = [s for s in sample if s.get("status") == "refused"]
    if len(refused) <= EVENT_SAMPLE_REFUSED_MAX:
        return sample
    keep = set(id(s) for s in refused[:EVENT_SAMPLE_REFUSED_MAX])
    return [s for s in sample if s.get("status") != "refused" or id(s) in keep]
