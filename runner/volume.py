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
  fresh worker is started in its place (at most 8 times, or once per worker if more).

Ray retries nothing on its own. Resume never depends on Ray: a fresh driver runs exactly
the ids that are not in the ledger.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from runner import events as ev
from runner.handler_errors import keep
from runner.inputs import Item
from runner.recording import ItemRecorder, RecordWriter
from runner.spec import batch_clock_s, healthy_cards
from runner.stage import StageContext, StageFailure
from runner.volume_queue import (
    DIED,
    LATE,
    RAISED,
    TIMEOUT,
    Batch,
    BatchQueue,
    refusal_reason,
)

PROGRESS_EVERY_S = 1.0
PER_WORKER_EVERY_S = 30.0  # the per-worker rates ride on a progress event this seldom ...
# ... or when the workers change (80 workers: about 3 KB a line)
NODES_EVERY_S = 5.0      # how often the driver looks for nodes gone from the cluster
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 10.0
ITEM_GRACE_S = 10.0      # the batch timeout waits this beyond a batch's item clock
HELD_AFTER_S = 10.0      # a batch out longer than this (and 3 × the slowest) is "held"
HELD_FACTOR = 3.0
CPU_WORKERS_MAX = 4
START_TIMEOUT_S = 600.0  # a worker started in place of another must answer within this
REPLACE_MIN = 8          # workers started again: at least this many, or one per worker
ISOLATED_MIN = 20        # inputs refused alone before the volume is judged broken ...
ISOLATED_SHARE = 0.01    # ... or this share of the inputs, whichever is larger
# outside_cause's answers: a worker lost for none of its batch's doing
NODE_UNREACHABLE = "its node (its raylet) cannot be reached"
NODE_DIED = "its node died"
KILLED_OUTSIDE = "it was killed from outside (ray.kill)"

__all__ = ["Batch", "Driver", "Worker", "run_volume", "healthy_cards"]


@dataclass
class Worker:
    key: int
    actor: Any
    node: str = ""
    host: str = ""
    cards: List[str] = field(default_factory=list)
    where: str = ""  # its node as the manifest names it (several nodes); else the host
    started: float = 0.0
    done: int = 0
    lost: bool = False
    excluded: bool = False

    @property
    def label(self) -> str:
        cards = ",".join(self.cards) if self.cards else "cpu"
        return f"w{self.key}@{self.place}[{cards}]"

    @property
    def place(self) -> str:
        """Its node: the manifest's address, else the hostname, else Ray's node id."""
        return self.where or self.host or self.node[:8]

    @property
    def usable(self) -> bool:
        return not (self.lost or self.excluded)


@dataclass
class Outstanding:
    batch: Batch
    worker: Worker
    since: float  # when it started running on its worker (handed out, or its turn came)


class Driver:
    """One pass over ``batches`` with the workers of one Ray session.

    ``spawn(key)`` starts a new worker's actor (None: no replacement); ``pilot_batch_s``
    is the pilot's measured seconds for one batch of the volume's size (the batch timeout
    before any batch finished); ``item_timeout_s`` is quoted in refusals.
    """

    def __init__(self, ctx: StageContext, recorder: ItemRecorder, ray: Any, workers: List[Worker],
                 batches: List[Batch], timeout_s: float, *, pilot_batch_s: float = 0.0,
                 item_timeout_s: float = 0.0, pilot_item_s: float = 0.0, in_flight: int = 1,
                 prefetch: int = 0,
                 spawn: Optional[Callable[[int], Any]] = None,
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
        self.spawn = spawn
        self.starting: Dict[Any, Tuple[Worker, float, str]] = {}  # ref -> (new, since, why)
        self.replacements_left = max(REPLACE_MIN, len(workers)) if spawn is not None else 0
        self.next_key = max((w.key for w in workers), default=-1) + 1
        self.slowest = self.pilot_batch_s  # the slowest batch so far: a running maximum
        self.writer: Optional[RecordWriter] = None
        self.recording_s = 0.0  # the recording thread's busy seconds over the pass
        self.last_per_card = -PER_WORKER_EVERY_S
        self.per_card_workers: List[str] = []
        self.lost_types = lost_errors(ray)
        self.total = recorder.total
        self.start_done = len(recorder.recorded)
        self.isolated_max = max(ISOLATED_MIN, int(ISOLATED_SHARE * self.total))
        self.t0 = self.clock()
        self.last_progress = 0.0
        self.last_nodes = self.t0
        self.re_executed = 0
        self.requeued = 0
        self.replaced = 0
        self.lost_nodes: Set[str] = set()
        self.isolated: Dict[str, str] = {}
        self.inputs_root = os.path.abspath(ctx.spec.inputs.dir)
        from runner.volume_limit import AdaptiveLimit

        self.limit = AdaptiveLimit.from_spec(ctx.spec.volume, clock=clock)

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
            if self.queue and not any(w.usable for w in self.workers) and not self.starting:
                raise StageFailure("pilot", "every worker of the volume was lost or excluded "
                                   f"with {len(self.queue)} batch(es) left",
                                   hint="the items recorded so far are kept; `preflight "
                                        "resume RUN` runs the rest on a fresh cluster",
                                   facts=self.facts())
            for ref in self._ready():
                if ref in self.starting:
                    self._started(ref)
                elif ref in self.out:
                    self._settle(ref)
            self._check_timeouts()
            self._check_nodes()
            self._progress()
        self._check_nodes(force=True)  # a node whose workers were lost before it looked dead
        for worker, _since, _why in self.starting.values():  # started for nothing
            self._kill(worker)

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
                seconds: Any = None) -> None:
        """Results recorded first-wins by the writer's thread, off the hand-out loop."""
        def job() -> None:
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
        refs = list(self.out) + list(self.starting)
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
                     reply.get("seconds"))

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
        self._record(o.worker, asked, results)
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
        if self._node_gone(w.node, reason):
            self._put_back(o, f"node {w.place} of worker {w.label} was lost")
            return
        outside = outside_cause(exc)
        if outside == NODE_DIED:  # Ray's own word, before ray.nodes() says so
            self._drop_node(w.node, reason)
        if outside is not None:  # the node may still look alive: a later look drops it
            self._put_back(o, f"worker {w.label} was lost: {outside} ({reason})")
            self._kill(w)  # should it answer again, its cards are freed
            if outside == KILLED_OUTSIDE:
                self._replace(w, reason)
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
        self._replace(w, reason)

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

    def _node_gone(self, node: str, reason: str) -> bool:
        if node in self.lost_nodes:
            return True
        try:
            alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        except Exception:  # the cluster's state is unreadable: say nothing about nodes
            return False
        if node in alive:
            return False
        self._drop_node(node, reason)
        return True

    def _check_nodes(self, force: bool = False) -> None:
        """Every few seconds (and once at the end): a node gone from the cluster is
        dropped with its workers, even before any call to them fails."""
        now = self.clock()
        if not force and now - self.last_nodes < NODES_EVERY_S:
            return
        self.last_nodes = now
        try:
            alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        except Exception:
            return
        # every node a worker ran on, its workers lost already or not: a raylet killed
        # fails its actors' calls at once, before the cluster marks the node dead
        for node in sorted({w.node for w in self.workers if w.node} - self.lost_nodes):
            if node not in alive:
                self._drop_node(node, "the node left the Ray cluster (not alive in "
                                      "ray.nodes())")

    def _drop_node(self, node: str, reason: str) -> None:
        self.lost_nodes.add(node)
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
            self._kill(w)
            self._failed(head, LATE, f"held past {limit:.0f} s")
            self._replace(w, f"held batch {head.batch.n} past {limit:.0f} s")

    def timeout(self, items: int = 1) -> float:
        """The batch timeout of a batch of ``items``: the spec's, else ten times the slowest
        batch (the pilot's measure before any batch finished here), at least 60 s, and never
        before the batch's item clock (``runner.spec.batch_clock_s``) could interrupt it on
        its worker, plus a grace: the interrupt keeps the worker, the timeout stops it."""
        if self.fixed_timeout > 0:
            return self.fixed_timeout
        slowest = self.slowest
        clock = batch_clock_s(items, self.item_timeout_s, self.pilot_item_s)
        clock = clock + ITEM_GRACE_S if clock > 0 else 0.0
        return max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * slowest, clock)

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

    # ------------------------------------------------------------------ workers
    def _kill(self, w: Worker) -> None:
        try:
            self.ray.kill(w.actor, no_restart=True)
        except Exception:  # already dead, or the cluster is gone
            pass

    def _replace(self, w: Worker, why: str) -> None:
        """A fresh worker in the place of ``w`` (Ray places it where cards are free)."""
        if self.spawn is None or self.replacements_left < 1:
            return
        self.replacements_left -= 1
        try:
            new = Worker(self.next_key, self.spawn(self.next_key))
            self.next_key += 1
            ref = new.actor.where.remote()
        except Exception as exc:  # the cluster refuses: go on with the others
            self._emit(ev.VOLUME_WORKER_STARTED, worker=None, why=f"in place of {w.label}",
                          error=f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        self.starting[ref] = (new, self.clock(), f"in place of {w.label} ({why})")

    def _started(self, ref: Any) -> None:
        new, _since, why = self.starting.pop(ref)
        try:
            info = self.ray.get(ref)
        except Exception as exc:
            info = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if info.get("error"):
            self._emit(ev.VOLUME_WORKER_STARTED, worker=None, why=why,
                          error=str(info["error"]))
            self._kill(new)
            return
        new.node, new.host = str(info.get("node") or ""), str(info.get("host") or "")
        new.where = str(info.get("where") or "")
        new.cards, new.started = [str(c) for c in info.get("cards") or []], self.clock()
        self.workers.append(new)
        self.lines[new.key] = []
        self.replaced += 1
        self._emit(ev.VOLUME_WORKER_STARTED, worker=new.label, node=new.node,
                      host=new.host, where=new.where or None, cards=new.cards,
                      run_dir=info.get("run_dir"), why=why)

    def _check_starting(self) -> None:
        now = self.clock()
        for ref, (new, since, why) in list(self.starting.items()):
            if now - since > START_TIMEOUT_S:
                del self.starting[ref]
                self._kill(new)
                self._emit(ev.VOLUME_WORKER_STARTED, worker=None, why=why,
                              error=f"no answer within {START_TIMEOUT_S:.0f} s")

    # ------------------------------------------------------------------ report
    def _progress(self, force: bool = False) -> None:
        self._check_starting()
        now = self.clock()
        if not force and now - self.last_progress < PROGRESS_EVERY_S:
            return
        self.last_progress = now
        done = len(self.recorder.recorded)
        elapsed = max(now - self.t0, 1e-6)
        rate = (done - self.start_done) / elapsed
        held = self.held(now)
        usable = [w for w in self.workers if w.usable]
        per_card: Dict[str, Any] = {}
        labels = [w.label for w in usable]
        if force or labels != self.per_card_workers \
                or now - self.last_per_card >= PER_WORKER_EVERY_S:
            self.last_per_card, self.per_card_workers = now, labels
            per_card["per_card"] = {w.label: round(w.done / max(now - w.started, 1e-6), 2)
                                    for w in usable}
        self._emit(ev.PROGRESS, done=done, total=self.total, items_per_s=round(rate, 2),
                   eta_s=round((self.total - done) / rate, 1) if rate > 0 else None,
                   held=len(held), held_s=round(held[0][0], 1) if held else None,
                   held_limit_s=round(held[0][1], 1) if held else None,
                   workers=len(usable), running_s=round(elapsed, 3), **per_card)
        widened = self.limit.check(done - self.start_done, self.total - done, self.total)
        if widened is not None:  # the watchdog moves the stage's deadline with it
            self._emit(ev.VOLUME_LIMIT, **widened)

    def facts(self) -> Dict[str, Any]:
        return {"engine": "ray", "workers": len(self.workers) - self.replaced,
                "workers_started_again": self.replaced,
                "workers_lost": sum(1 for w in self.workers if w.lost),
                "workers_excluded": sum(1 for w in self.workers if w.excluded),
                "nodes_lost": len(self.lost_nodes), "batches_requeued": self.requeued,
                "batches_split": self.queue.splits, "in_flight": self.in_flight,
                "prefetch": self.prefetch,
                "batch_timeout_s": round(self.timeout(), 3),
                "refused_alone": len(self.isolated),
                "refused_alone_ids": sorted(self.isolated)[:20],
                "re_executed": self.re_executed,
                "recording_s": round(self.recording_s, 3),
                "items_per_s": round((len(self.recorder.recorded) - self.start_done)
                                     / max(self.clock() - self.t0, 1e-6), 2)}


def outside_cause(exc: BaseException) -> Optional[str]:
    """Why a worker's lost call is none of its batch's doing, or None (its process died
    while its node lived: maybe because of what the batch holds). Read from Ray's error
    type and the death cause the GCS wrote into it (Ray 2.60, seen on a real cluster):
    a raylet killed fails its actors' calls at once with ``ActorUnavailableError``,
    seconds before ``ray.nodes()`` marks the node dead; ``ActorDiedError`` says "because
    its node has died" (or is ``preempted``) once the GCS knows, and "killed by
    `ray.kill`" for a worker stopped from outside (the driver's own kills end the
    worker's batches first). A worker process SIGKILLed alone reads like a crash and is
    not matched here."""
    names = {t.__name__ for t in type(exc).__mro__}
    if names & {"ActorUnavailableError", "NodeDiedError", "ObjectLostError"}:
        return NODE_UNREACHABLE
    text = str(exc)
    if getattr(exc, "preempted", False) is True or "its node has died" in text:
        return NODE_DIED
    if "killed by `ray.kill`" in text:
        return KILLED_OUTSIDE
    return None


def run_volume(ctx: StageContext, remaining: List[Item],
               recorder: ItemRecorder) -> Dict[str, Any]:
    """Run ``remaining`` on Ray; returns the pilot stage's volume facts."""
    from runner import volume_ray

    vspec = ctx.spec.volume
    if vspec is None:
        raise StageFailure("pilot", "the spec has no volume section")
    if vspec.gpus and not vspec.address and vspec.cards is None:
        vspec = dataclasses.replace(vspec, cards=healthy_cards(ctx.facts))
    report_node_proofs(ctx, vspec.nodes or [])
    volume_ray.clean_local_session(ctx.run_dir)  # a killed driver's leftovers, if any
    volume_ray.prepare_env(vspec)
    ray = volume_ray.import_ray()
    cpu_workers = vspec.workers or min(CPU_WORKERS_MAX, os.cpu_count() or 1)
    facts = volume_ray.start(ray, vspec, ctx.run_dir, cpu_workers)
    workers: List[Worker] = []  # the driver adds the workers it starts in place of others
    try:
        spawn = _worker_factory(ctx, ray, vspec, recorder.ledger.attempt)
        workers.extend(_start_workers(ctx, ray, vspec, cpu_workers, spawn))
        size = max(1, int(vspec.batch_size or ctx.spec.task.batch_size or 1))
        batches = [Batch(n, remaining[i:i + size])
                   for n, i in enumerate(range(0, len(remaining), size))]
        from runner.itemtimeout import item_timeout, pilot_item_s

        facts.update(Driver(ctx, recorder, ray, workers, batches,
                            float(vspec.batch_timeout_s or 0),
                            pilot_batch_s=float(vspec.pilot_batch_s or 0),
                            item_timeout_s=item_timeout(ctx.spec),
                            pilot_item_s=pilot_item_s(ctx.spec),
                            in_flight=int(vspec.in_flight or 1),
                            prefetch=int(vspec.prefetch), spawn=spawn).run())
        if vspec.address:  # several nodes: their handlers' files come to the head
            facts["node_outputs"] = collect_node_outputs(
                ctx, ray, workers, keep_on_nodes=bool(vspec.outputs_on_nodes))
        return facts
    finally:
        volume_ray.stop(ray, [w.actor for w in workers], ctx.run_dir)


def collect_node_outputs(ctx: StageContext, ray: Any, workers: List[Worker], *,
                         keep_on_nodes: bool = False) -> Dict[str, Any]:
    """One live worker of each node lists its node's ``outputs/``; the files of every
    node but the head are copied to the head's, checked (runner/volume_outputs.py), before
    the evidence stage checksums them; with ``keep_on_nodes`` (``volume.outputs_on_nodes``)
    they stay there and only each node's listing (paths, sizes, SHA-256) is written on the
    head. A failure here leaves the files on their nodes and is told in the facts; it never
    fails the volume."""
    from runner.volume_outputs import collect_outputs, record_outputs

    live = [w for w in workers if w.usable]
    try:
        listings = ray.get([w.actor.outputs_listing.remote() for w in live], timeout=600)
        chosen: Dict[str, Tuple[Worker, Dict[str, Any]]] = {}
        for worker, listing in zip(live, listings):
            run_dir = listing.get("run_dir")
            if run_dir and run_dir not in chosen:
                chosen[str(run_dir)] = (worker, listing)
        pairs = list(chosen.values())
        if keep_on_nodes:
            return record_outputs(ctx.run_dir, [listing for _w, listing in pairs])
        facts = collect_outputs(ctx.run_dir, [listing for _w, listing in pairs],
                                lambda i, rel, off, n: ray.get(
                                    pairs[i][0].actor.outputs_chunk.remote(rel, off, n),
                                    timeout=600))
    except Exception as exc:  # a worker lost meanwhile, Ray gone: the files stay there
        facts = {"files": 0, "bytes": 0, "refused": [
            f"the nodes' outputs were not collected: {type(exc).__name__}: {exc}"]}
    return dict(facts)


def report_node_proofs(ctx: StageContext, nodes: List[Dict[str, Any]]) -> None:
    """Each card a node's proof left out (the dispatcher's, before Ray started), told
    once per driver start as ``volume.card_excluded``."""
    for node in nodes:
        for card in node.get("excluded") or []:
            ctx.emit(ev.VOLUME_CARD_EXCLUDED, node=node.get("where"), host=node.get("host"),
                     cards=[str(card.get("card"))], stage=card.get("stage"),
                     reason=card.get("reason"))


def _worker_factory(ctx: StageContext, ray: Any, vspec: Any,
                    attempt: int = 1) -> Callable[[int], Any]:
    """Starts one worker's actor (its handler loaded there); the key names it and, with
    the attempt, its output shards (``a<attempt>-w<key>-<seq>.jsonl``)."""
    from runner.volume_ray import worker_class

    cls = worker_class(ray, vspec.cards_per_worker, vspec.gpus)
    device = "cuda" if vspec.gpus else "cpu"
    spec = ctx.spec.to_dict()
    outputs = os.path.join(ctx.run_dir, "outputs")
    path = list(sys.path)
    return lambda key: cls.remote(spec, outputs, path, device, f"a{attempt}-w{key}")


def _start_workers(ctx: StageContext, ray: Any, vspec: Any, cpu_workers: int,
                   spawn: Callable[[int], Any]) -> List[Worker]:
    count = vspec.workers or _worker_count(ray, vspec, cpu_workers)
    if count < 1:
        raise StageFailure("pilot", f"the cluster offers no worker: {_resources(ray)} for "
                           f"{vspec.cards_per_worker} card(s) per worker",
                           hint="check the healthy cards of each node (device/compute facts)")
    workers = [Worker(k, spawn(k)) for k in range(count)]
    try:
        where = ray.get([w.actor.where.remote() for w in workers], timeout=600)
    except Exception as exc:
        raise StageFailure("pilot", f"the volume's workers did not start: "
                           f"{type(exc).__name__}: {str(exc)[:400]}",
                           hint="look at the Ray logs of the nodes") from exc
    now = time.monotonic()
    for w, info in zip(workers, where):
        if info.get("error"):
            raise StageFailure("pilot", f"worker on {info.get('where') or info.get('host')}: "
                               f"{info['error']}",
                               hint="check task.handler and project.dir on every node")
        w.node, w.host, w.cards, w.started = info["node"], info["host"], info["cards"], now
        w.where = str(info.get("where") or "")
    # run_dir None: the driver's own paths; threads: torch's, as the actor chose them
    ctx.emit(ev.VOLUME_WORKERS, workers=[{"worker": w.label, "node": w.node, "host": w.host,
                                          "where": w.where or None,
                                          "cards": w.cards, "run_dir": info.get("run_dir"),
                                          "item_timeout": info.get("item_timeout"),
                                          **(info.get("threads") or {})}
                                         for w, info in zip(workers, where)])
    return workers


def _worker_count(ray: Any, vspec: Any, cpu_workers: int) -> int:
    if not vspec.gpus:
        return cpu_workers if not vspec.address else int(_total(ray, "CPU"))
    count = 0
    for node in ray.nodes():
        if node.get("Alive"):
            count += int(float(node.get("Resources", {}).get("GPU", 0))
                         // vspec.cards_per_worker)
    return count


def _total(ray: Any, key: str) -> float:
    return float(ray.cluster_resources().get(key, 0))


def _resources(ray: Any) -> str:
    res = ray.cluster_resources()
    return f"{res.get('GPU', 0):g} card(s), {res.get('CPU', 0):g} CPU(s)"



