"""The pilot, balance and evidence stages.

``pilot`` runs the task over the inputs through the ledger (resumable, exactly once per
id); ``balance`` recomputes the balance from the ledger and writes balance.json/.csv with
the sample review; ``evidence`` copies the run's evidence to ``results.copy_to`` and
verifies the copy. Standard library only at import time.
"""

from __future__ import annotations

import csv
import json
import os
import time
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from runner.balance import Balance, Problem, Tally, compute_balance
from runner.inputs import InputsError, Item, list_inputs
from runner.ledger import Anomaly, Ledger, LedgerError, Row, ledger_path
from runner.stages import StageContext, StageFailure, StageSkipped

EVENT_SAMPLE_REFUSED_MAX = 100
EVENT_PROBLEMS_MAX = 200       # the balance event names this many; balance.json has all
SAMPLE_REFUSED_MAX = 1000      # refused items sampled with their input; the csv has all
JSON_ROWS_MAX = 10_000          # above this, the per-id rows are in balance.csv only


class Recorder:
    """Audits a task's results for a batch, commits them to the ledger, then emits.

    Nothing the task returns is dropped: a result that cannot be recorded as an item
    (an id not asked for, one returned twice, no id, an unknown status) becomes a ledger
    anomaly, which the balance lists as a problem.
    """

    def __init__(self, ctx: StageContext, ledger: Ledger, items: List[Item],
                 done: Set[str]) -> None:
        self.ctx = ctx
        self.ledger = ledger
        self.all_ids = {it.id for it in items}
        self.total = len(items)
        self.recorded: Set[str] = set(done) & self.all_ids
        self.sizes = {it.id: it.size for it in items}
        self.outputs_dir = os.path.join(ctx.run_dir, "outputs")

    def record(self, asked: Iterable[str], results: Any,
               elapsed_s: Optional[float] = None) -> int:
        """Audit, commit, then emit one ``item.done`` per recorded item.

        Each event carries the item's ``input_bytes`` and, when known, ``elapsed_s``: the
        batch's measured seconds shared equally by the items asked (``elapsed_s``), else the
        seconds the task itself reported for the item (a numeric ``elapsed_s`` in its
        result). The forecast of the volume is made from these.
        """
        asked_set = set(asked)
        rows, anomalies = self.audit(asked_set, results)
        self.ledger.record(rows, anomalies)
        share = elapsed_s / len(asked_set) if elapsed_s is not None and asked_set else None
        reported = _reported_seconds(results)
        for row in rows:
            self.recorded.add(row.id)
            timing: Dict[str, Any] = {"input_bytes": self.sizes.get(row.id)}
            seconds = share if share is not None else reported.get(row.id)
            if seconds is not None:
                timing["elapsed_s"] = round(seconds, 6)
            self.ctx.emit("item.done", **row.to_result(), **timing)
        self.ctx.emit("progress", done=len(self.recorded), total=self.total)
        return len(rows)

    def audit(self, asked: Set[str], results: Any) -> tuple[List[Row], List[Anomaly]]:
        rows: List[Row] = []
        anomalies: List[Anomaly] = []
        if not isinstance(results, (list, tuple)):
            anomalies.append(Anomaly("bad_id", None,
                                     f"task returned {type(results).__name__}, not a list"))
            return rows, anomalies
        seen: Set[str] = set()
        for res in results:
            bad = self._bad(res, asked, seen)
            if bad is not None:
                anomalies.append(bad)
                continue
            seen.add(res["id"])
            try:
                rows.append(self._row(res))
            except (TypeError, ValueError) as exc:  # an output json cannot write
                anomalies.append(Anomaly("bad_output", res["id"],
                                         f"output is not JSON ({exc}); item not recorded"))
        return rows, anomalies

    def _bad(self, res: Any, asked: Set[str], seen: Set[str]) -> Optional[Anomaly]:
        if not isinstance(res, dict) or not isinstance(res.get("id"), str) or not res["id"]:
            return Anomaly("bad_id", None, f"result without a usable id: {res!r:.120}")
        iid = res["id"]
        if iid in seen or iid in self.recorded:
            return Anomaly("duplicate", iid, "returned more than once")
        if iid not in asked:
            detail = ("not among the inputs" if iid not in self.all_ids
                      else "not asked for in this batch")
            return Anomaly("invented", iid, detail)
        if res.get("status") not in ("accepted", "refused"):
            return Anomaly("bad_status", iid,
                           f"status {res.get('status')!r} is neither accepted nor refused")
        return None

    def _row(self, res: Dict[str, Any]) -> Row:
        iid = res["id"]
        output = res.get("output")
        if isinstance(output, (dict, list)):
            from runner.workloads import write_output

            output = write_output(self.outputs_dir, iid,
                                  json.dumps(output, sort_keys=True).encode("utf-8"))
        if isinstance(output, str) and os.path.isabs(output):
            rel = os.path.relpath(output, self.ctx.run_dir)
            output = rel if not rel.startswith("..") else output
        accepted = res["status"] == "accepted"
        return Row(id=iid, status=res["status"],
                   category=_opt_str(res.get("category")) if accepted else None,
                   reason=None if accepted else _opt_str(res.get("reason")),
                   output=output if isinstance(output, str) else None)


def _reported_seconds(results: Any) -> Dict[str, float]:
    """Per-item seconds a task reported itself (``elapsed_s``, a number >= 0), by id."""
    out: Dict[str, float] = {}
    for res in results if isinstance(results, (list, tuple)) else ():
        if isinstance(res, dict) and isinstance(res.get("id"), str):
            value = res.get("elapsed_s")
            if isinstance(value, (int, float)) and not isinstance(value, bool) \
                    and 0 <= value < float("inf"):
                out[res["id"]] = float(value)
    return out


def _opt_str(value: Any) -> Optional[str]:
    return None if value is None else str(value)


def pilot(ctx: StageContext) -> Dict[str, Any]:
    """Run the task on the inputs not yet in the ledger, batch by batch."""
    spec = ctx.spec
    items = _inputs(spec, "pilot")
    os.makedirs(os.path.join(ctx.run_dir, "outputs"), exist_ok=True)
    _clean_temp(os.path.join(ctx.run_dir, "outputs"))
    ledger = _open_ledger(ctx, "pilot")
    try:
        done = ledger.done_ids()
        replayed = _replay(ctx, ledger) if ctx.resume else 0
        remaining = [it for it in items if it.id not in done]
        facts: Dict[str, Any] = {
            "items": len(items), "already_done": len(done), "remaining": len(remaining),
            "resumed": bool(ctx.resume), "replayed": replayed, "attempt": ledger.attempt,
        }
        if not remaining:
            ctx.emit("progress", done=len(done), total=len(items))
            facts["note"] = f"nothing to do: all {len(done)} items were already done"
            return facts
        recorder = Recorder(ctx, ledger, items, done)
        if spec.task.kind == "train":
            from runner.workloads.train import train_pilot

            facts.update(train_pilot(ctx, remaining, recorder))
        elif spec.task.command:
            from runner.command import run_command

            facts.update(run_command(ctx, remaining, recorder))
        else:
            facts["recorded"] = _run_handler(ctx, remaining, recorder)
        facts["done"] = len(recorder.recorded)
        return facts
    except LedgerError as exc:
        raise StageFailure("pilot", str(exc), hint="check the run directory's disk") from exc
    finally:
        ledger.close()


def _run_handler(ctx: StageContext, remaining: List[Item], recorder: Recorder) -> int:
    from runner.workloads import HandlerError, load_handler, make_context

    spec = ctx.spec
    try:
        handler = load_handler(spec)
    except HandlerError as exc:
        raise StageFailure("pilot", str(exc), hint="check task.handler and project.dir") from exc
    wctx = make_context(spec, recorder.outputs_dir)
    wctx.device = ctx.device
    size = max(1, int(spec.task.batch_size or 1))
    recorded = 0
    for start in range(0, len(remaining), size):
        batch = remaining[start:start + size]
        began = time.perf_counter()
        try:
            results = handler(batch, wctx)
        except Exception as exc:
            ids = ", ".join(it.id for it in batch[:5]) + (" ..." if len(batch) > 5 else "")
            raise StageFailure(
                "pilot", f"task.handler raised {type(exc).__name__}: {exc} (batch: {ids})",
                hint="the items recorded so far are kept; fix the handler and resume",
                facts={"recorded": recorded}) from exc
        recorded += recorder.record([it.id for it in batch], results,
                                    elapsed_s=time.perf_counter() - began)
    return recorded


def _inputs(spec: Any, stage: str) -> List[Item]:
    try:
        return list_inputs(spec)
    except InputsError as exc:
        raise StageFailure(stage, str(exc), hint="check inputs.dir and inputs.pattern") from exc


def _open_ledger(ctx: StageContext, stage: str) -> Ledger:
    try:
        return Ledger.open(ledger_path(ctx.run_dir), new_attempt=stage == "pilot")
    except LedgerError as exc:
        raise StageFailure(stage, str(exc), hint="check the run directory") from exc


def _clean_temp(outputs_dir: str) -> None:
    """Remove temporary files a killed process left behind (never a final output)."""
    for name in os.listdir(outputs_dir):
        if name.startswith(".") and ".tmp-" in name:
            try:
                os.remove(os.path.join(outputs_dir, name))
            except OSError:
                pass


def _replay(ctx: StageContext, ledger: Ledger) -> int:
    """Emit item.done for ledger items whose event never reached events.jsonl."""
    seen = _done_ids_in_events(os.path.join(ctx.run_dir, "events.jsonl"))
    n = 0
    for row in ledger.rows():
        if row.id not in seen:
            ctx.emit("item.done", replayed=True, **row.to_result())
            n += 1
    return n


def _done_ids_in_events(path: str) -> Set[str]:
    ids: Set[str] = set()
    try:
        fh = open(path, "rb")
    except OSError:
        return ids
    with fh:
        for raw in fh:
            if b'"item.done"' not in raw or not raw.endswith(b"\n"):
                continue
            try:
                obj = json.loads(raw)
            except ValueError:
                continue
            if isinstance(obj, dict) and obj.get("type") == "item.done":
                ids.add(str(obj.get("id")))
    return ids


def balance(ctx: StageContext) -> Dict[str, Any]:
    """Balance from the ledger; writes balance.json and balance.csv; fails when not ok.

    The ledger is streamed in id order beside the sorted inputs, and balance.csv is
    written row by row, so a run of a million items never holds its results in memory.
    """
    spec = ctx.spec
    items = _inputs(spec, "balance")
    if not os.path.exists(ledger_path(ctx.run_dir)):
        raise StageFailure("balance", "no ledger.sqlite in the run directory",
                           hint="the pilot stage did not record anything")
    ledger = _open_ledger(ctx, "balance")
    csv_path = os.path.join(ctx.run_dir, "balance.csv")
    try:
        with _AtomicText(csv_path) as fh:
            bal, sample, rows = _stream_balance(spec, items, ledger.rows(), fh)
        for a in ledger.anomalies():
            bal.problems.append(Problem(a.kind, a.id, a.detail))
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
    _write_atomic(os.path.join(ctx.run_dir, "balance.json"),
                  json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
    event = bal.to_dict()
    event["sample"] = _event_sample(sample)
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


def _categories(spec: Any) -> List[str]:
    cats = list(spec.task.categories or [])
    return cats or (["train"] if spec.task.kind == "train" else [])


CSV_COLUMNS = ["id", "status", "category", "reason", "output", "input_bytes"]


def _stream_balance(spec: Any, items: List[Item], rows: Iterable[Row],
                    out: Any) -> Tuple[Balance, List[Dict[str, Any]],
                                       Optional[List[Dict[str, Any]]]]:
    """One pass over the inputs (sorted by id) and the ledger rows (sorted by id).

    Writes one balance.csv line per input (``missing`` for an id the ledger lacks), judges
    each id with the shared rules, and keeps only the sample review and, for a run of at
    most JSON_ROWS_MAX inputs, the rows for balance.json. A ledger id that is not among
    the inputs (the inputs changed between attempts) is an ``invented`` problem.
    """
    tally = Tally(spec.inputs.expected_refusals, _categories(spec), keep_rows=False)
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

    def __init__(self, spec: Any) -> None:
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


def balance_from_rows(spec: Any, items: List[Item], rows: List[Row],
                      anomalies: List[Anomaly]) -> Balance:
    """The balance of in-memory rows (the streamed stage gives the same answer)."""
    bal = compute_balance([it.id for it in items], spec.inputs.expected_refusals,
                          _categories(spec), [r.to_result() for r in rows],
                          expected_count=spec.inputs.expected_count or None)
    for a in anomalies:
        bal.problems.append(Problem(a.kind, a.id, a.detail))
    return bal


def sample_review(spec: Any, items: List[Item], rows: List[Row]) -> List[Dict[str, Any]]:
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
    return data.decode("utf-8", errors="replace")[:chars]


def _event_sample(sample: List[Dict[str, Any]]) -> List[Dict[str, Any]]:
    refused = [s for s in sample if s.get("status") == "refused"]
    if len(refused) <= EVENT_SAMPLE_REFUSED_MAX:
        return sample
    keep = set(id(s) for s in refused[:EVENT_SAMPLE_REFUSED_MAX])
    return [s for s in sample if s.get("status") != "refused" or id(s) in keep]


class _AtomicText:
    """A text file written under a temporary name, fsynced and renamed on success only."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.tmp = f"{path}.tmp-{os.getpid()}"
        self.fh: Any = None

    def __enter__(self) -> Any:
        self.fh = open(self.tmp, "w", encoding="utf-8", newline="")
        return self.fh

    def __exit__(self, etype: Any, exc: Any, tb: Any) -> None:
        if etype is None:
            self.fh.flush()
            os.fsync(self.fh.fileno())
            self.fh.close()
            os.replace(self.tmp, self.path)
            return
        self.fh.close()
        try:
            os.remove(self.tmp)
        except OSError:
            pass


def _write_atomic(path: str, text: str) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8", newline="") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def evidence(ctx: StageContext) -> Dict[str, Any]:
    """Copy the evidence to results.copy_to/<run_id>/, then read it back and verify."""
    from runner.evidence import EvidenceError, copy_evidence, join_dest

    dest = ctx.spec.results.copy_to
    if not dest:
        raise StageSkipped("no copy_to in the manifest")
    target = join_dest(dest, ctx.spec.run_id)
    try:
        report = copy_evidence(ctx.run_dir, target)
    except EvidenceError as exc:
        raise StageFailure("evidence", str(exc),
                           hint="check results.copy_to is writable from this node") from exc
    ctx.emit("evidence", dest=target, files=report.files, bytes=report.bytes,
             verified=report.verified, problems=report.problems)
    facts = {"dest": target, "files": report.files, "bytes": report.bytes,
             "verified": report.verified}
    if not report.verified:
        raise StageFailure("evidence", "the copy does not verify: " + "; ".join(report.problems),
                           facts=facts, hint="re-run the copy; check the destination's disk")
    return facts
