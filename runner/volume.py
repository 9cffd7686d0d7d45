"""The volume's driver: the full corpus on every worker of a Ray cluster, each id once.

The driver is the ledger's single writer. It hands out batches to idle workers (one Ray
actor each), records each result with a first-wins, id-keyed insert, and re-queues the
batch of a worker that was lost (its node died, its process died) or that holds a batch
past the batch timeout (that worker is then excluded; should its result still come back,
the items already recorded are counted as ``re_executed``, never recorded twice). Ray
retries nothing on its own. Resume never depends on Ray: a fresh driver runs exactly the
ids that are not in the ledger.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Deque, Dict, List, Optional, Set

from runner import events as ev
from runner.inputs import Item
from runner.stages import StageContext, StageFailure

PROGRESS_EVERY_S = 1.0
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 10.0
CPU_WORKERS_MAX = 4


@dataclass
class Batch:
    n: int
    items: List[Item]
    sent: int = 0  # times handed out

    def payload(self, root: str) -> List[List[Any]]:
        """Each item's path relative to the inputs root: a worker resolves it against its
        own node's copy of the inputs (``runner.volume_ray._Worker``)."""
        return [[it.id, os.path.relpath(it.path, root), it.size] for it in self.items]


@dataclass
class Worker:
    key: int
    actor: Any
    node: str = ""
    host: str = ""
    cards: List[str] = field(default_factory=list)
    started: float = 0.0
    done: int = 0
    lost: bool = False
    excluded: bool = False

    @property
    def label(self) -> str:
        cards = ",".join(self.cards) if self.cards else "cpu"
        return f"w{self.key}@{self.host or self.node[:8]}[{cards}]"


@dataclass
class Outstanding:
    batch: Batch
    worker: Worker
    since: float
    late: bool = False  # its batch was re-queued after the timeout


class Driver:
    """One pass over ``remaining`` with the workers of one Ray session."""

    def __init__(self, ctx: StageContext, recorder: Any, ray: Any, workers: List[Worker],
                 batches: List[Batch], timeout_s: float) -> None:
        from runner.volume_ray import lost_errors

        self.ctx, self.recorder, self.ray = ctx, recorder, ray
        self.workers = workers
        self.queue: Deque[Batch] = collections.deque(batches)
        self.out: Dict[Any, Outstanding] = {}
        self.fixed_timeout = timeout_s
        self.batch_seconds: List[float] = []
        self.lost_types = lost_errors(ray)
        self.total = recorder.total
        self.start_done = len(recorder.recorded)
        self.t0 = time.monotonic()
        self.last_progress = 0.0
        self.re_executed = 0
        self.requeued = 0
        self.lost_nodes: Set[str] = set()
        self.inputs_root = os.path.abspath(ctx.spec.inputs.dir)

    # ------------------------------------------------------------------ loop
    def run(self) -> Dict[str, Any]:
        while self.queue or any(not o.late for o in self.out.values()):
            self._hand_out()
            if self.queue and not any(not (w.lost or w.excluded) for w in self.workers):
                raise StageFailure("pilot", "every worker of the volume was lost or excluded "
                                   f"with {len(self.queue)} batch(es) left",
                                   hint="the items recorded so far are kept; `preflight "
                                        "resume RUN` runs the rest on a fresh cluster",
                                   facts=self.facts())
            ready, _ = self.ray.wait(list(self.out), num_returns=1, timeout=0.5)
            for ref in ready:
                self._settle(ref)
            self._check_timeouts()
            self._progress()
        self._progress(force=True)
        return self.facts()

    def _hand_out(self) -> None:
        busy = {o.worker.key for o in self.out.values() if not o.late}
        for w in self.workers:
            if not self.queue:
                return
            if w.lost or w.excluded or w.key in busy:
                continue
            batch = self.queue.popleft()
            batch.sent += 1
            ref = w.actor.run.remote(batch.payload(self.inputs_root))
            self.out[ref] = Outstanding(batch, w, time.monotonic())

    def _settle(self, ref: Any) -> None:
        o = self.out.pop(ref)
        try:
            reply = self.ray.get(ref)
        except self.lost_types as exc:
            self._lost(o, exc)
            return
        if "error" in reply:
            ids = ", ".join(it.id for it in o.batch.items[:5])
            raise StageFailure("pilot", f"{reply['error']} (worker {o.worker.label}, batch: "
                               f"{ids}{' ...' if len(o.batch.items) > 5 else ''})",
                               hint="the items recorded so far are kept; fix the handler "
                                    "and resume", facts=self.facts())
        self.batch_seconds.append(time.monotonic() - o.since)
        asked = [it.id for it in o.batch.items]
        new, again = self.recorder.record_first_wins(asked, reply.get("results"),
                                                     elapsed_s=reply.get("seconds"))
        o.worker.done += new
        self.re_executed += again
        if o.late:
            self.ctx.emit(ev.VOLUME_LATE, batch=o.batch.n, worker=o.worker.label,
                          recorded=new, re_executed=again)

    def _lost(self, o: Outstanding, exc: BaseException) -> None:
        w = o.worker
        if not w.lost:
            w.lost = True
            self.ctx.emit(ev.VOLUME_WORKER_LOST, worker=w.label, node=w.node, cards=w.cards,
                          reason=f"{type(exc).__name__}: {str(exc)[:300]}")
            self._check_node(w.node)
        if not o.late:
            self._requeue(o.batch, f"worker {w.label} was lost")

    def _check_node(self, node: str) -> None:
        if node in self.lost_nodes:
            return
        try:
            alive = {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        except Exception:  # the cluster's state is unreadable: say nothing about nodes
            return
        if node not in alive:
            self.lost_nodes.add(node)
            gone = [w for w in self.workers if w.node == node]
            for w in gone:
                w.lost = True
            self.ctx.emit(ev.VOLUME_NODE_LOST, node=node, workers=[w.label for w in gone],
                          cards=sorted({c for w in gone for c in w.cards}))

    def _requeue(self, batch: Batch, reason: str) -> None:
        self.requeued += 1
        self.queue.appendleft(batch)
        self.ctx.emit(ev.VOLUME_REQUEUED, batch=batch.n, items=len(batch.items), reason=reason)

    def _check_timeouts(self) -> None:
        limit = self.timeout()
        now = time.monotonic()
        for o in list(self.out.values()):
            if o.late or now - o.since <= limit:
                continue
            o.late = True
            o.worker.excluded = True
            self.ctx.emit(ev.VOLUME_CARD_EXCLUDED, worker=o.worker.label, cards=o.worker.cards,
                          reason=f"batch {o.batch.n} out for more than {limit:.0f} s")
            self._requeue(Batch(o.batch.n, o.batch.items, o.batch.sent),
                          f"worker {o.worker.label} held it past {limit:.0f} s")

    def timeout(self) -> float:
        if self.fixed_timeout > 0:
            return self.fixed_timeout
        slowest = max(self.batch_seconds) if self.batch_seconds else 0.0
        return max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * slowest)

    # ------------------------------------------------------------------ report
    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self.last_progress < PROGRESS_EVERY_S:
            return
        self.last_progress = now
        done = len(self.recorder.recorded)
        elapsed = max(now - self.t0, 1e-6)
        rate = (done - self.start_done) / elapsed
        self.ctx.emit(ev.PROGRESS, done=done, total=self.total, items_per_s=round(rate, 2),
                      eta_s=round((self.total - done) / rate, 1) if rate > 0 else None,
                      per_card={w.label: round(w.done / max(now - w.started, 1e-6), 2)
                                for w in self.workers if not (w.lost or w.excluded)},
                      workers=sum(1 for w in self.workers if not (w.lost or w.excluded)))

    def facts(self) -> Dict[str, Any]:
        return {"engine": "ray", "workers": len(self.workers),
                "workers_lost": sum(1 for w in self.workers if w.lost),
                "workers_excluded": sum(1 for w in self.workers if w.excluded),
                "nodes_lost": len(self.lost_nodes), "batches_requeued": self.requeued,
                "re_executed": self.re_executed,
                "items_per_s": round((len(self.recorder.recorded) - self.start_done)
                                     / max(time.monotonic() - self.t0, 1e-6), 2)}


def run_volume(ctx: StageContext, remaining: List[Item], recorder: Any) -> Dict[str, Any]:
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
    actors: List[Any] = []
    try:
        workers = _start_workers(ctx, ray, vspec, cpu_workers)
        actors = [w.actor for w in workers]
        size = max(1, int(vspec.batch_size or ctx.spec.task.batch_size or 1))
        batches = [Batch(n, remaining[i:i + size])
                   for n, i in enumerate(range(0, len(remaining), size))]
        facts.update(Driver(ctx, recorder, ray, workers, batches,
                            float(vspec.batch_timeout_s or 0)).run())
        return facts
    finally:
        volume_ray.stop(ray, actors, ctx.run_dir)


def report_node_proofs(ctx: StageContext, nodes: List[Dict[str, Any]]) -> None:
    """Each card a node's proof left out (the dispatcher's, before Ray started), told
    once per driver start as ``volume.card_excluded``."""
    for node in nodes:
        for card in node.get("excluded") or []:
            ctx.emit(ev.VOLUME_CARD_EXCLUDED, node=node.get("where"), host=node.get("host"),
                     cards=[str(card.get("card"))], stage=card.get("stage"),
                     reason=card.get("reason"))


def healthy_cards(facts: Dict[str, Dict[str, Any]]) -> Optional[List[int]]:
    """The cards this run's own card stages proved healthy (the latest stage that said)."""
    for stage in ("interconnect", "compute", "device"):
        cards = (facts.get(stage) or {}).get("healthy_cards")
        if isinstance(cards, list) and all(isinstance(c, int) for c in cards):
            return sorted(cards)
    return None


def _start_workers(ctx: StageContext, ray: Any, vspec: Any, cpu_workers: int) -> List[Worker]:
    from runner.volume_ray import worker_class

    count = vspec.workers or _worker_count(ray, vspec, cpu_workers)
    if count < 1:
        raise StageFailure("pilot", f"the cluster offers no worker: {_resources(ray)} for "
                           f"{vspec.cards_per_worker} card(s) per worker",
                           hint="check the healthy cards of each node (device/compute facts)")
    cls = worker_class(ray, vspec.cards_per_worker, vspec.gpus)
    device = "cuda" if vspec.gpus else "cpu"
    spec = ctx.spec.to_dict()
    outputs = os.path.join(ctx.run_dir, "outputs")
    workers = [Worker(k, cls.remote(spec, outputs, list(sys.path), device))
               for k in range(count)]
    try:
        where = ray.get([w.actor.where.remote() for w in workers], timeout=600)
    except Exception as exc:
        raise StageFailure("pilot", f"the volume's workers did not start: "
                           f"{type(exc).__name__}: {str(exc)[:400]}",
                           hint="look at the Ray logs of the nodes") from exc
    now = time.monotonic()
    for w, info in zip(workers, where):
        if info.get("error"):
            raise StageFailure("pilot", f"worker on {info.get('host')}: {info['error']}",
                               hint="check task.handler and project.dir on every node")
        w.node, w.host, w.cards, w.started = info["node"], info["host"], info["cards"], now
    # run_dir None: the driver's own paths; threads: torch's, as the actor chose them
    ctx.emit(ev.VOLUME_WORKERS, workers=[{"worker": w.label, "node": w.node, "host": w.host,
                                          "cards": w.cards, "run_dir": info.get("run_dir"),
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



