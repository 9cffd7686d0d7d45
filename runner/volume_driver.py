"""The volume's driver: the full corpus on every worker of a Ray cluster, each id once.

The driver is the ledger's single writer. It keeps up to ``volume.in_flight`` batches on
each worker (one Ray actor each, which runs them one after another), records each result
with a first-wins, id-keyed insert, and keeps going whatever fails:

- a worker lost with its node (the node gone from ``ray.nodes()``, or Ray's error says
  so: ``outside_cause``) or killed from outside has every batch it held put back whole,
  at the front, for the others, counted against no input; a node gone from the cluster
  is dropped with every worker on it;
- a batch that failed because of what it holds (the handler raised, an item ran past
  ``task.item_timeout_s`` on its worker, the worker held it past the batch timeout, the
  worker's process died while its node lived: the batch it was running, not those
  queued behind it) is split (one input a batch after a hang, else halves) until the
  input that fails is alone, and that input is refused with the reason
  (``runner.volume_queue``); the batch timeout never comes before a batch's item clock;
- a worker past the batch timeout is excluded and stopped (its cards freed), and a
  fresh worker is started in its place (``runner/volume_workers.py``'s Replacements).

Ray retries nothing. Resume never depends on Ray: a fresh driver runs the ids not in the
ledger. The shards of a batch's outputs are recorded (``ShardBook``) for the collection.
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from runner import events as ev
from runner.handler_errors import keep
from runner.outputs import shard_prefix
from runner.recording import ItemRecorder, RecordWriter
from runner.stage import StageContext, StageFailure
from runner.volume_collect import ShardBook
from runner.volume_progress import Progress
from runner.volume_queue import (
    DIED,
    LATE,
    RAISED,
    TIMEOUT,
    Batch,
    BatchQueue,
    batch_timeout,
    refusal_reason,
)
from runner.volume_workers import (
    KILLED_OUTSIDE,
    NODE_DIED,
    Nodes,
    Outstanding,
    Replacements,
    Worker,
    kill,
    outside_cause,
)

HELD_AFTER_S = 10.0      # a batch out longer than this (and 3 × the slowest) is "held"
HELD_FACTOR = 3.0
ISOLATED_MIN = 20        # inputs refused alone before the volume is judged broken ...
ISOLATED_SHARE = 0.01    # ... or this share of the inputs, whichever is larger


class Driver:
    """One pass over ``batches`` with the workers of one Ray session.

    ``spawn(key)`` starts a new worker's actor (None: no replacement); ``pilot_batch_s``
    is the pilot's measured seconds for one batch of the volume's size (the batch timeout
    before any batch finished); ``item_timeout_s`` is quoted in refusals.
    """

    def __init__(self, ctx: StageContext, recorder: ItemRecorder, ray: Any, workers: List[Worker],
                 batches: List[Batch], timeout_s: float, *, pilot_batch_s: float = 0.0,
                 item_timeout_s: float = 0.0, pilot_item_s: float = 0.0, in_flight: int = 1,
                 prefetch: int = 0, spawn: Optional[Callable[[int], Any]] = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        from runner.volume_ray import lost_errors

        self.clock = clock
        self.ctx, self.recorder, self.ray = ctx, recorder, ray
        self.workers = workers
        self.queue = BatchQueue(batches)
        self.out: Dict[Any, Outstanding] = {}
        self.lines: Dict[int, List[Any]] = {w.key: [] for w in workers}  # refs, in order
        self.fixed_timeout = timeout_s
        self.pilot_batch_s = max(0.0, float(pilot_batch_s or 0))
        self.item_timeout_s = float(item_timeout_s or 0)
        self.pilot_item_s = float(pilot_item_s or 0)
        self.in_flight = max(1, int(in_flight or 1))
        self.prefetch = max(0, int(prefetch or 0))  # batches each worker reads ahead
        self.replacements = Replacements(ray, workers, spawn, self._emit, clock)
        self.slowest = self.pilot_batch_s  # the slowest batch so far: a running maximum
        self.writer: Optional[RecordWriter] = None
        self.recording_s = 0.0  # the recording thread's busy seconds over the pass
        self.lost_types = lost_errors(ray)
        self.total = recorder.total
        self.isolated_max = max(ISOLATED_MIN, int(ISOLATED_SHARE * self.total))
        self.report = Progress(ctx.spec.volume, self.total, len(recorder.recorded), clock)
        self.nodes = Nodes(ray, clock)
        self.re_executed = self.requeued = 0
        self.isolated: Dict[str, str] = {}
        self.inputs_root = os.path.abspath(ctx.spec.inputs.dir)
        self.book = ShardBook(ctx.run_dir)

    # ------------------------------------------------------------------ loop
    def run(self) -> Dict[str, Any]:
        """The pass; every result is recorded (the writer drained) when it returns or
        raises."""
        self.writer = RecordWriter()
        try:
            self._pass()
        except BaseException:
            self.writer.close()  # what came back is kept for the resume
            self.writer = None
            raise
        error = self.writer.close()
        self.recording_s, self.writer = self.writer.busy_s, None
        self._check_writer(error)
        self._progress(force=True)  # every result recorded: the final count
        return self.facts()

    def _pass(self) -> None:
        while self.queue or self.out:
            self._check_writer()
            self._hand_out()
            if self.queue and not any(w.usable for w in self.workers) \
                    and not self.replacements.starting:
                raise StageFailure("pilot", "every worker of the volume was lost or excluded "
                                   f"with {len(self.queue)} batch(es) left",
                                   hint="the items recorded so far are kept; `preflight "
                                        "resume RUN` runs the rest on a fresh cluster",
                                   facts=self.facts())
            for ref in self._ready():
                if ref in self.replacements.starting:
                    self._started(ref)
                elif ref in self.out:
                    self._settle(ref)
            self._check_timeouts()
            self._check_nodes()
            self._progress()
        self._check_nodes(force=True)  # a node whose workers were lost before it looked dead
        self.replacements.stop_all()

    def _started(self, ref: Any) -> None:
        """A worker started in place of another answered: it takes batches from now."""
        new = self.replacements.started(ref)
        if new is not None:
            self.workers.append(new)
            self.lines[new.key] = []

    def _later(self, job: Callable[[], Any]) -> None:
        """``job`` on the writer's thread, after what was given before (now, outside a
        pass): the ledger, the events and the run directory's files are written there."""
        if self.writer is None:
            job()
        else:
            self.writer.put(job)

    def _emit(self, etype: str, **data: Any) -> None:
        """An event, in its order with the records (the writer's thread emits them all)."""
        self._later(lambda: self.ctx.emit(etype, **data))

    def _record(self, worker: Worker, asked: List[str], results: Any,
                seconds: Any = None, shards: Any = None) -> None:
        """Results recorded first-wins by the writer's thread, off the hand-out loop
        (the shards holding their outputs first)."""
        def job() -> None:
            self.book.add(worker.label, shards,
                          prefix=shard_prefix(self.recorder.ledger.attempt, worker.key))
            new, again = self.recorder.record_first_wins(asked, results, elapsed_s=seconds)
            worker.done += new
            self.re_executed += again

        self._later(job)

    def _check_writer(self, error: Optional[BaseException] = None) -> None:
        """The recording's first error, if any, as the stage's failure (what was recorded
        before it is kept)."""
        error = error or (self.writer.error if self.writer is not None else None)
        if error is not None:
            raise StageFailure("pilot", f"the results could not be recorded: "
                               f"{type(error).__name__}: {error}",
                               hint="check the run directory's disk; what was recorded is "
                                    "kept and `preflight resume RUN` runs the rest",
                               facts=self.facts()) from error

    def _ready(self) -> List[Any]:
        """What came back: waits up to half a second for one, then takes every other
        one already there without waiting."""
        refs = list(self.out) + list(self.replacements.starting)
        if not refs:
            return []
        ready, rest = self.ray.wait(refs, num_returns=1, timeout=0.5)
        if ready and rest:
            more, _ = self.ray.wait(rest, num_returns=len(rest), timeout=0)
            ready = list(ready) + list(more)
        return list(ready)

    def _hand_out(self) -> None:
        for depth in range(1, self.in_flight + 1):  # one each first, then a second each
            for w in self.workers:
                if not self.queue:
                    return
                line = self.lines.setdefault(w.key, [])
                if not w.usable or len(line) >= depth:
                    continue
                batch = self.queue.take(w.key, steal=not line)
                if batch is None:
                    continue
                ref = self._send(w, batch)
                self.out[ref] = Outstanding(batch, w, self.clock())
                line.append(ref)

    def _send(self, w: Worker, batch: Batch) -> Any:
        """``run`` on worker ``w``; with read ahead, the batches it runs next go with it
        (``runner/readahead.py``: their files are read while this one computes)."""
        payload = batch.payload(self.inputs_root)
        if not self.prefetch:
            return w.actor.run.remote(payload)
        ahead = self.queue.reserve(w.key, self.prefetch)
        return w.actor.run.remote(payload, [b.payload(self.inputs_root) for b in ahead])

    def _forget(self, ref: Any) -> Optional[Outstanding]:
        """Take ``ref`` off the books; the worker's next batch starts its clock now."""
        o = self.out.pop(ref, None)
        if o is None:
            return None
        line = self.lines.get(o.worker.key, [])
        if ref in line:
            head = line[0] == ref
            line.remove(ref)
            if head and line and line[0] in self.out:
                self.out[line[0]].since = self.clock()
        return o

    def _settle(self, ref: Any) -> None:
        line = self.lines.get(self.out[ref].worker.key, []) if ref in self.out else []
        running = bool(line) and line[0] == ref  # the batch its worker was running
        o = self._forget(ref)
        if o is None:
            return
        try:
            reply = self.ray.get(ref)
        except self.lost_types as exc:
            self._lost(o, exc, running)
            return
        if "error" in reply:
            cause = str(reply.get("cause") or RAISED)
            if reply.get("traceback"):  # where the handler raised, kept in the run dir
                ids, label = [it.id for it in o.batch.items], o.worker.label
                self._later(lambda: keep(self.ctx.run_dir, ids, str(reply["error"]),
                                         reply.get("where"), str(reply["traceback"]),
                                         batch=o.batch.n, worker=label))
            self._failed(o, TIMEOUT if cause == TIMEOUT else RAISED, str(reply["error"]),
                         kept=self._keep_partial(o, reply), suspect=reply.get("suspect"))
            return
        if isinstance(reply.get("seconds"), (int, float)):
            self.slowest = max(self.slowest, float(reply["seconds"]))
        self._record(o.worker, [it.id for it in o.batch.items], reply.get("results"),
                     reply.get("seconds"), reply.get("shards"))

    # ------------------------------------------------------------------ failures
    def _keep_partial(self, o: Outstanding, reply: Dict[str, Any]) -> Set[str]:
        """The results a failed call yielded before it failed (a generator handler,
        ``runner/handler_call.py``; their outputs already in a shard on the worker's
        node), recorded like any batch's: the ids of the batch not run again."""
        results = reply.get("results")
        if not isinstance(results, list) or not results:
            return set()
        ids = {it.id for it in o.batch.items}
        asked = [r["id"] for r in results if isinstance(r, dict) and r.get("id") in ids]
        self._record(o.worker, asked, results, shards=reply.get("shards"))
        # recorded by the writer's thread: a well-formed result counts as kept now (one
        # the audit refuses is a ledger anomaly, as in a batch that did not fail)
        return {r["id"] for r in results if isinstance(r, dict) and r.get("id") in ids
                and r.get("status") in ("accepted", "refused")}

    def _failed(self, o: Outstanding, cause: str, detail: str, *,
                kept: Optional[Set[str]] = None, suspect: Any = None) -> None:
        """A batch that failed because of what it holds: split, or its input refused."""
        batch = o.batch
        reason = refusal_reason(cause, detail, item_timeout_s=self.item_timeout_s,
                                batch_timeout_s=self.timeout())
        split = self.queue.failed(batch, cause, reason, kept=kept or (),
                                  suspect=suspect if isinstance(suspect, str) else None)
        for iid, why in split.refused:
            self.isolated[iid] = why
            self._record(o.worker, [iid], [{"id": iid, "status": "refused", "reason": why}])
        if split.parts or split.refused:
            hint = {"kept": len(kept or ()), "suspect": suspect} if kept or suspect else {}
            self._emit(ev.VOLUME_SPLIT, batch=batch.n, items=len(batch.items), cause=cause,
                          worker=o.worker.label, reason=detail[:300], parts=list(split.parts),
                          refused=[{"id": i, "reason": r} for i, r in split.refused], **hint)
        elif split.retried:
            self._note_requeue(batch, f"worker {o.worker.label} died while running it "
                                      "alone; it is tried once more")
        if len(self.isolated) > self.isolated_max:
            shown = "; ".join(f"{i}: {r}" for i, r in list(self.isolated.items())[:3])
            raise StageFailure(
                "pilot", f"{len(self.isolated)} inputs failed alone (more than "
                f"{self.isolated_max}): {shown}",
                hint="the handler fails on many inputs: fix it and `preflight resume RUN` "
                     "(the items recorded so far, these refusals included, are kept)",
                facts=self.facts())

    def _lost(self, o: Outstanding, exc: BaseException, running: bool = True) -> None:
        """A call of worker ``o.worker`` failed with one of Ray's lost errors. Lost with
        its node, or from outside (``outside_cause``): every batch it held goes back
        whole, at the front, counted against no input. Its process died while its node
        lived: the batch it was running (``running``: ``o``'s, else the one ahead of it)
        is blamed (``_failed``, cause ``died``), the others go back whole."""
        w = o.worker
        reason = f"{type(exc).__name__}: {str(exc)[:300]}"
        if w.lost or w.excluded:  # its batches were already dealt with
            return
        w.lost = True
        self._emit(ev.VOLUME_WORKER_LOST, worker=w.label, node=w.node, cards=w.cards,
                      reason=reason)
        if self.nodes.gone(w.node):
            if w.node not in self.nodes.lost:
                self._drop_node(w.node, reason)
            self._put_back(o, f"node {w.place} of worker {w.label} was lost")
            return
        outside = outside_cause(exc)
        if outside == NODE_DIED:  # Ray's own word, before ray.nodes() says so
            self._drop_node(w.node, reason)
        if outside is not None:  # the node may still look alive: a later look drops it
            self._put_back(o, f"worker {w.label} was lost: {outside} ({reason})")
            kill(self.ray, w)  # should it answer again, its cards are freed
            if outside == KILLED_OUTSIDE:
                self.replacements.start(w, reason)
            return
        # its node lives: the worker died under the batch it ran (maybe because of an input)
        line = self.lines.get(w.key) or []
        if not running and line and line[0] in self.out:
            blamed = self._forget(line[0])
            self.queue.put_back(o.batch)
            self._note_requeue(o.batch, f"worker {w.label} was lost before it ran this batch")
            o = blamed or o
        self._release(w, f"worker {w.label} was lost")
        self._failed(o, DIED, reason)
        self.replacements.start(w, reason)

    def _put_back(self, o: Outstanding, reason: str) -> None:
        self.queue.put_back(o.batch)
        self._note_requeue(o.batch, reason)
        self._release(o.worker, reason)

    def _release(self, w: Worker, reason: str) -> None:
        """Every batch still on worker ``w`` back to the queue, in their order (those
        reserved for it to read ahead behind them)."""
        self.queue.release(w.key)
        line = self.lines.get(w.key, [])
        for ref in reversed(list(line)):
            o = self.out.pop(ref, None)
            if o is not None:
                self.queue.put_back(o.batch)
                self._note_requeue(o.batch, reason)
        line.clear()

    def _note_requeue(self, batch: Batch, reason: str) -> None:
        self.requeued += 1
        self._emit(ev.VOLUME_REQUEUED, batch=batch.n, items=len(batch.items), reason=reason)

    def _check_nodes(self, force: bool = False) -> None:
        """Every few seconds (and once at the end): a node gone from the cluster is
        dropped with its workers, even before any call to them fails."""
        for node in self.nodes.left(self.workers, force):
            self._drop_node(node, "the node left the Ray cluster (not alive in ray.nodes())")

    def _drop_node(self, node: str, reason: str) -> None:
        self.nodes.lost.add(node)
        gone = [w for w in self.workers if w.node == node]
        host = next((w.place for w in gone if w.place), "")
        self._emit(ev.VOLUME_NODE_LOST, node=node, host=host, reason=reason,
                      workers=[w.label for w in gone],
                      cards=sorted({c for w in gone for c in w.cards}))
        for w in gone:
            if not (w.lost or w.excluded):  # each worker lost once, whichever saw it first
                self._emit(ev.VOLUME_WORKER_LOST, worker=w.label, node=w.node,
                              cards=w.cards, reason=f"its node was lost: {reason}")
            w.lost = True
            self._release(w, f"node {host or node[:8]} was lost")

    def _check_timeouts(self) -> None:
        now = self.clock()
        for w in self.workers:
            line = self.lines.get(w.key) or []
            if not w.usable or not line or line[0] not in self.out:
                continue
            head = self.out[line[0]]
            limit = self.timeout(len(head.batch.items))
            if now - head.since <= limit:
                continue
            w.excluded = True
            self._emit(ev.VOLUME_CARD_EXCLUDED, worker=w.label, cards=w.cards,
                          reason=f"batch {head.batch.n} out for more than {limit:.0f} s; "
                                 "the worker is stopped and its cards freed")
            self._forget(line[0])
            self._release(w, f"worker {w.label} was excluded")
            kill(self.ray, w)
            self._failed(head, LATE, f"held past {limit:.0f} s")
            self.replacements.start(w, f"held batch {head.batch.n} past {limit:.0f} s")

    def timeout(self, items: int = 1) -> float:
        """The batch timeout of a batch of ``items``: the spec's, else ``batch_timeout``'s."""
        if self.fixed_timeout > 0:
            return self.fixed_timeout
        return batch_timeout(items, self.slowest, self.item_timeout_s, self.pilot_item_s)

    def held(self, now: float) -> List[Tuple[float, float]]:
        """(seconds out, its batch timeout) of each batch a worker runs that is out well
        past what a batch takes (3 × the slowest, at least ``HELD_AFTER_S``), the longest
        first: the ETA admits them."""
        after = max(HELD_AFTER_S, HELD_FACTOR * self.slowest)
        out = []
        for w in self.workers:
            line = self.lines.get(w.key) or []
            if w.usable and line and line[0] in self.out:
                head = self.out[line[0]]
                if now - head.since > after:
                    out.append((now - head.since, self.timeout(len(head.batch.items))))
        return sorted(out, reverse=True)

    def _progress(self, force: bool = False) -> None:
        self.replacements.expire()
        now = self.report.due(force)
        if now is None:
            return
        usable = [w for w in self.workers if w.usable]
        for etype, data in self.report.events(now, len(self.recorder.recorded), usable,
                                              self.held(now), force):
            self._emit(etype, **data)

    def facts(self) -> Dict[str, Any]:
        replaced = self.replacements.count
        return {"engine": "ray", "workers": len(self.workers) - replaced,
                "workers_started_again": replaced,
                "workers_lost": sum(1 for w in self.workers if w.lost),
                "workers_excluded": sum(1 for w in self.workers if w.excluded),
                "nodes_lost": len(self.nodes.lost), "batches_requeued": self.requeued,
                "batches_split": self.queue.splits, "in_flight": self.in_flight,
                "prefetch": self.prefetch,
                "batch_timeout_s": round(self.timeout(), 3),
                "refused_alone": len(self.isolated),
                "refused_alone_ids": sorted(self.isolated)[:20],
                "re_executed": self.re_executed,
                "recording_s": round(self.recording_s, 3),
                "items_per_s": round(self.report.rate(len(self.recorder.recorded)), 2)}
