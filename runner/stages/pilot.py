"""The pilot stage: the task over the inputs, through the ledger (resumable, exactly once
per id). ``Recorder`` audits what a task returns before anything is recorded; the command
runner and the training pilot record through it too. Standard library only at import time.
"""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

from runner.events import ITEM_DONE, expand_items, parse_line
from runner.files import is_temp_name
from runner.inputs import InputsError, Item, list_inputs
from runner.ledger import Anomaly, Ledger, LedgerError, Row, ledger_path
from runner.outputs import SHARDS
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure


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
        # ids whose output was lost with its node (runner/volume_lost.py): recorded again,
        # their event says so (``rerun``), so the bot takes it instead of the first
        self.rerun: Set[str] = ledger.forgotten_ids() & self.all_ids
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
            timing: Dict[str, Any] = {"input_bytes": self.sizes.get(row.id),
                                      **self._rerun(row.id)}
            seconds = share if share is not None else reported.get(row.id)
            if seconds is not None:
                timing["elapsed_s"] = round(seconds, 6)
            self.ctx.emit("item.done", **row.to_result(), **timing)
        self.ctx.emit("progress", done=len(self.recorded), total=self.total)
        return len(rows)

    def _rerun(self, iid: str) -> Dict[str, Any]:
        """``{"rerun": True}`` for an id forgotten because its output was lost (its
        earlier item event stands replaced), once; else nothing."""
        if iid in self.rerun:
            self.rerun.discard(iid)
            return {"rerun": True}
        return {}

    def record_first_wins(self, asked: Iterable[str], results: Any,
                          elapsed_s: Optional[float] = None) -> Tuple[int, int]:
        """Record a batch whose items may already be recorded (the volume's re-queued
        batches): the first result of an id wins, a later one counts as re-executed.
        Returns (items recorded now, items re-executed)."""
        asked_set = set(asked)
        again = 0
        fresh: Any = results
        if isinstance(results, (list, tuple)):
            fresh = []
            for res in results:
                iid = res.get("id") if isinstance(res, dict) else None
                if iid in asked_set and iid in self.recorded:
                    again += 1
                else:
                    fresh.append(res)
        rows, anomalies = self.audit(asked_set, fresh)
        already = set(self.ledger.record_first_wins(rows, anomalies))
        self.ledger.count_re_executed(again)
        share = elapsed_s / len(asked_set) if elapsed_s is not None and asked_set else None
        new = [row for row in rows if row.id not in already]
        for row in new:
            self.recorded.add(row.id)
            timing: Dict[str, Any] = {"input_bytes": self.sizes.get(row.id),
                                      **self._rerun(row.id)}
            if share is not None:
                timing["elapsed_s"] = round(share, 6)
            self.ctx.emit("item.done", **row.to_result(), **timing)
        return len(new), again + len(already)

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
    items = list_stage_inputs(spec, "pilot")
    os.makedirs(os.path.join(ctx.run_dir, "outputs"), exist_ok=True)
    _clean_temp(os.path.join(ctx.run_dir, "outputs"))
    ledger = open_ledger(ctx, "pilot")
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
        facts.update(_run_task(ctx, remaining, recorder))
        facts["done"] = len(recorder.recorded)
        if len(recorder.recorded) == len(set(done) & recorder.all_ids):
            raise StageFailure(
                "pilot", f"the task returned no usable result for any of the {len(remaining)} "
                "items it was given (a handler that returns None or an empty list, or "
                "results without the items' ids)", facts=facts, error_type="NoResults",
                hint="return one {\"id\", \"status\", ...} dict per item of the batch; "
                     "balance.json lists what came back")
        return facts
    except LedgerError as exc:
        raise StageFailure("pilot", str(exc), hint="check the run directory's disk") from exc
    finally:
        ledger.close()


def _run_task(ctx: StageContext, remaining: List[Item], recorder: Recorder) -> Dict[str, Any]:
    """The pilot's work, by what the spec asks: a Blender render, a training pilot, the
    volume on Ray, an external command, or the in-process handler; returns its facts."""
    spec = ctx.spec
    facts: Dict[str, Any] = {}
    if not spec.task.command and spec.preparation != "blender" and spec.volume is None:
        from runner.threads import set_torch_threads, worker_share

        # the handler's or trainer's torch, as a volume worker will run it when one follows
        facts.update(set_torch_threads(spec.task.torch_threads,
                                       owned=worker_share(spec.task.worker_cards, ctx.facts)))
        if spec.task.worker_cards is not None:
            facts["threads_as"] = "volume worker"
    if spec.preparation == "blender" and spec.volume is None:
        from runner.blender.stages import render_pilot

        facts.update(render_pilot(ctx, remaining, recorder))
    elif spec.task.kind == "train":
        from runner.workloads.train import train_pilot

        facts.update(train_pilot(ctx, remaining, recorder))
    elif spec.volume is not None and not spec.task.command:
        from runner.volume import run_volume

        facts.update(run_volume(ctx, remaining, recorder))
        facts["re_executed_total"] = recorder.ledger.re_executed()
    elif spec.task.command:
        from runner.command import run_command

        facts.update(run_command(ctx, remaining, recorder))
    else:
        facts.update(_run_handler(ctx, remaining, recorder))
    return facts


def _run_handler(ctx: StageContext, remaining: List[Item],
                 recorder: Recorder) -> Dict[str, Any]:
    """The handler batch by batch under the per-item timeout (runner/stages/batches.py)."""
    from runner.itemtimeout import item_timeout
    from runner.stages.batches import Batches
    from runner.workloads import HandlerError, load_handler, make_context

    spec = ctx.spec
    try:
        handler = load_handler(spec)
    except HandlerError as exc:
        raise StageFailure("pilot", str(exc), hint="check task.handler and project.dir") from exc
    wctx = make_context(spec, recorder.outputs_dir)
    wctx.device = ctx.device
    size = max(1, int(spec.task.batch_size or 1))
    return Batches(handler, wctx, recorder, item_timeout(spec)).run(remaining, size)


def list_stage_inputs(spec: RunSpec, stage: str) -> List[Item]:
    try:
        return list_inputs(spec)
    except InputsError as exc:
        raise StageFailure(stage, str(exc), hint="check inputs.dir and inputs.pattern") from exc


def open_ledger(ctx: StageContext, stage: str) -> Ledger:
    try:
        return Ledger.open(ledger_path(ctx.run_dir), new_attempt=stage == "pilot")
    except LedgerError as exc:
        raise StageFailure(stage, str(exc), hint="check the run directory") from exc


def _clean_temp(outputs_dir: str) -> None:
    """Remove temporary files a killed process left behind (never a final output), in
    ``outputs/`` and its shards (runner/outputs.py)."""
    for folder in (outputs_dir, os.path.join(outputs_dir, SHARDS)):
        try:
            names = os.listdir(folder)
        except OSError:
            continue
        for name in names:
            if is_temp_name(name):
                try:
                    os.remove(os.path.join(folder, name))
                except OSError:
                    pass


def _replay(ctx: StageContext, ledger: Ledger) -> int:
    """Emit item.done for ledger items whose event never reached events.jsonl (for an id
    once forgotten, its ``rerun`` event: the one before it was of the lost output)."""
    owed = ledger.forgotten_counts()  # a rerun event per time the id was forgotten
    seen, reruns = _done_ids_in_events(os.path.join(ctx.run_dir, "events.jsonl"))
    n = 0
    for row in ledger.rows():
        again = row.id in owed
        if (reruns.get(row.id, 0) < owed[row.id]) if again else row.id not in seen:
            ctx.emit("item.done", replayed=True, **({"rerun": True} if again else {}),
                     **row.to_result())
            n += 1
    return n


def _done_ids_in_events(path: str) -> Tuple[Set[str], Dict[str, int]]:
    """The ids with an item event in ``path``, and how many ``rerun`` ones each has."""
    ids: Set[str] = set()
    reruns: Dict[str, int] = {}
    try:
        fh = open(path, "rb")
    except OSError:
        return ids, reruns
    with fh:
        for raw in fh:
            if not raw.endswith(b"\n") or (b'"item.done"' not in raw
                                           and b'"item.batch"' not in raw):
                continue
            try:
                events = expand_items([parse_line(raw.decode("utf-8"))])
            except ValueError:  # a torn or foreign line: its items are replayed
                continue
            for e in events:
                if e.type == ITEM_DONE:
                    iid = str(e.data.get("id"))
                    ids.add(iid)
                    if e.data.get("rerun") is True:
                        reruns[iid] = reruns.get(iid, 0) + 1
    return ids, reruns
