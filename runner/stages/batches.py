"""An in-process handler over the pilot's batches, under the per-item clock.

A batch gets ``task.item_timeout_s`` per item (runner/itemtimeout.py). A generator
handler's results are taken as they are yielded (runner/handler_call.py): those yielded
before a failure are recorded. A batch past its time is run again item by item (those
without a result); an item past the timeout alone is refused with a reason
naming the timeout, so the rest of its batch is recorded and the balance stays exact.
``in_flight`` names the batch a killed pilot was in. Standard library only.
"""

from __future__ import annotations

import time
from typing import Any, Dict, List, Set

from runner.handler_call import BatchCall
from runner.inputs import InputsError, Item, list_inputs
from runner.itemtimeout import ItemClock, ItemTimedOut
from runner.ledger import Ledger, LedgerError, ledger_path
from runner.recording import ItemRecorder
from runner.spec import RunSpec
from runner.stage import StageFailure
from runner.workloads import Handler, WorkloadContext


class Batches:
    """Calls the handler batch by batch and records through ``recorder``."""

    def __init__(self, handler: Handler, wctx: WorkloadContext, recorder: ItemRecorder,
                 per_item_s: float) -> None:
        self.handler, self.wctx, self.recorder = handler, wctx, recorder
        self.clock = ItemClock(per_item_s)
        self.recorded = 0
        self.timed_out: List[str] = []

    def run(self, remaining: List[Item], size: int) -> Dict[str, Any]:
        with self.clock:
            for start in range(0, len(remaining), size):
                self.batch(remaining[start:start + size])
        facts: Dict[str, Any] = {"recorded": self.recorded, "timed_out": self.timed_out,
                                 "item_timeout_s": self.clock.per_item_s}
        if self.clock.why_off:
            facts["item_timeout"] = f"off: {self.clock.why_off}"
        return facts

    def batch(self, batch: List[Item]) -> None:
        began = time.perf_counter()
        call = BatchCall(self.handler, batch, self.wctx)  # a generator's yields are kept
        try:
            results = self.clock.call(call, len(batch))
        except ItemTimedOut:
            kept = self._keep(batch, call)
            if len(batch) == 1 and not kept:
                self._refuse(batch[0])
            else:  # which item hung? each one again, alone, under its own time
                for item in batch:
                    if item.id not in kept:
                        self.batch([item])
            return
        except Exception as exc:
            self._keep(batch, call)
            ids = ", ".join(it.id for it in batch[:5]) + (" ..." if len(batch) > 5 else "")
            raise StageFailure(
                "pilot", f"task.handler raised {type(exc).__name__}: {exc} (batch: {ids})",
                hint="the items recorded so far are kept; fix the handler and resume",
                facts={"recorded": self.recorded}) from exc
        self.recorded += self.recorder.record([it.id for it in batch], results,
                                              elapsed_s=time.perf_counter() - began)

    def _keep(self, batch: List[Item], call: BatchCall) -> Set[str]:
        """Record what a generator handler yielded before it failed; the ids recorded."""
        ids = {it.id for it in batch}
        asked = [r["id"] for r in call.results if isinstance(r, dict) and r.get("id") in ids]
        if not asked:
            return set()
        self.recorded += self.recorder.record(asked, list(call.results))
        return {iid for iid in asked if iid in self.recorder.recorded}

    def _refuse(self, item: Item) -> None:
        reason = (f"timeout: no result within task.item_timeout_s = "
                  f"{self.clock.per_item_s:g} s (the handler was interrupted)")
        self.timed_out.append(item.id)
        self.recorded += self.recorder.record(
            [item.id], [{"id": item.id, "status": "refused", "reason": reason}])


def in_flight(spec: RunSpec, run_dir: str) -> str:
    """The batch the pilot was in when it was killed: the first items its ledger lacks
    (batches run in input order over the items not yet done)."""
    try:
        items = list_inputs(spec)
        ledger = Ledger.open(ledger_path(run_dir))
        try:
            done = ledger.done_ids()
        finally:
            ledger.close()
    except (InputsError, LedgerError, OSError) as exc:
        return f"the batch in flight is unknown ({exc})"
    left = [it.id for it in items if it.id not in done]
    if not left:
        return "every item was already recorded"
    size = max(1, int(spec.task.batch_size or 1))
    batch = left[:size]
    shown = ", ".join(batch[:10]) + (f" and {len(batch) - 10} more" if len(batch) > 10 else "")
    return (f"in flight: the batch of {len(batch)} item(s) {shown} "
            f"({len(done)} of {len(items)} items recorded)")
