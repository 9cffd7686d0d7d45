"""The volume's workers: one Ray actor each, how they start, how one is lost, and the
fresh ones the driver starts in place of those it lost or excluded.

A worker's call lost with its node, or killed from outside, is none of its batch's
doing (``outside_cause``); the driver (``runner/volume_driver.py``) decides what follows.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

from runner import events as ev
from runner.outputs import shard_prefix
from runner.stage import StageContext, StageFailure
from runner.volume_queue import Batch

CPU_WORKERS_MAX = 4
START_TIMEOUT_S = 600.0  # a worker started in place of another must answer within this
REPLACE_MIN = 8          # workers started again: at least this many, or one per worker
NODES_EVERY_S = 5.0      # how often the driver looks for nodes gone from the cluster
# outside_cause's answers: a worker lost for none of its batch's doing
NODE_UNREACHABLE = "its node (its raylet) cannot be reached"
NODE_DIED = "its node died"
KILLED_OUTSIDE = "it was killed from outside (ray.kill)"

Emit = Callable[..., None]


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


def kill(ray: Any, w: Worker) -> None:
    try:
        ray.kill(w.actor, no_restart=True)
    except Exception:  # already dead, or the cluster is gone
        pass


class Replacements:
    """Fresh workers started in place of lost or excluded ones (Ray places each where
    cards are free): at most ``REPLACE_MIN``, or one per worker if more; each must say
    where it runs within ``START_TIMEOUT_S`` or is stopped. ``spawn(key)`` starts one
    worker's actor (None: no replacement)."""

    def __init__(self, ray: Any, workers: List[Worker], spawn: Optional[Callable[[int], Any]],
                 emit: Emit, clock: Callable[[], float]) -> None:
        self.ray, self.spawn, self.emit, self.clock = ray, spawn, emit, clock
        self.left = max(REPLACE_MIN, len(workers)) if spawn is not None else 0
        self.next_key = max((w.key for w in workers), default=-1) + 1
        self.starting: Dict[Any, Tuple[Worker, float, str]] = {}  # ref -> (new, since, why)
        self.count = 0

    def start(self, w: Worker, why: str) -> None:
        """A fresh worker in the place of ``w``; it joins once it answers (``started``)."""
        if self.spawn is None or self.left < 1:
            return
        self.left -= 1
        try:
            new = Worker(self.next_key, self.spawn(self.next_key))
            self.next_key += 1
            ref = new.actor.where.remote()
        except Exception as exc:  # the cluster refuses: go on with the others
            self.emit(ev.VOLUME_WORKER_STARTED, worker=None, why=f"in place of {w.label}",
                      error=f"{type(exc).__name__}: {str(exc)[:300]}")
            return
        self.starting[ref] = (new, self.clock(), f"in place of {w.label} ({why})")

    def started(self, ref: Any) -> Optional[Worker]:
        """The worker whose ``where`` answered ``ref``, ready to run batches; None if it
        failed to start (told, and stopped)."""
        new, _since, why = self.starting.pop(ref)
        try:
            info = self.ray.get(ref)
        except Exception as exc:
            info = {"error": f"{type(exc).__name__}: {str(exc)[:300]}"}
        if info.get("error"):
            self.emit(ev.VOLUME_WORKER_STARTED, worker=None, why=why, error=str(info["error"]))
            kill(self.ray, new)
            return None
        new.node, new.host = str(info.get("node") or ""), str(info.get("host") or "")
        new.where = str(info.get("where") or "")
        new.cards, new.started = [str(c) for c in info.get("cards") or []], self.clock()
        self.count += 1
        self.emit(ev.VOLUME_WORKER_STARTED, worker=new.label, node=new.node, host=new.host,
                  where=new.where or None, cards=new.cards, run_dir=info.get("run_dir"),
                  why=why)
        return new

    def expire(self) -> None:
        """Those that did not answer within ``START_TIMEOUT_S`` stopped and told."""
        now = self.clock()
        for ref, (new, since, why) in list(self.starting.items()):
            if now - since > START_TIMEOUT_S:
                del self.starting[ref]
                kill(self.ray, new)
                self.emit(ev.VOLUME_WORKER_STARTED, worker=None, why=why,
                          error=f"no answer within {START_TIMEOUT_S:.0f} s")

    def stop_all(self) -> None:
        """The pass is over: those still starting were started for nothing."""
        for worker, _since, _why in self.starting.values():
            kill(self.ray, worker)


class Nodes:
    """The cluster's nodes as the driver sees them: those it dropped (``lost``), and a
    look at ``ray.nodes()`` every ``NODES_EVERY_S``."""

    def __init__(self, ray: Any, clock: Callable[[], float]) -> None:
        self.ray, self.clock = ray, clock
        self.lost: Set[str] = set()
        self.last = clock()

    def alive(self) -> Optional[Set[str]]:
        """The live nodes' ids; None when the cluster's state is unreadable."""
        try:
            return {n["NodeID"] for n in self.ray.nodes() if n.get("Alive")}
        except Exception:  # say nothing about nodes
            return None

    def gone(self, node: str) -> bool:
        """Whether ``node`` was dropped or is no longer alive (unreadable: not gone)."""
        if node in self.lost:
            return True
        alive = self.alive()
        return alive is not None and node not in alive

    def left(self, workers: List[Worker], force: bool = False) -> List[str]:
        """Every few seconds (or ``force``): the nodes a worker ran on, its workers lost
        already or not, that left the cluster and are not dropped yet (a raylet killed
        fails its actors' calls at once, before the cluster marks the node dead)."""
        now = self.clock()
        if not force and now - self.last < NODES_EVERY_S:
            return []
        self.last = now
        alive = self.alive()
        if alive is None:
            return []
        return sorted({w.node for w in workers if w.node} - self.lost - alive)


def worker_factory(ctx: StageContext, ray: Any, vspec: Any,
                   attempt: int = 1) -> Callable[[int], Any]:
    """Starts one worker's actor (its handler loaded there); the key names it and, with
    the attempt, its output shards (``a<attempt>-w<key>-<seq>.jsonl``)."""
    from runner.volume_ray import worker_class

    cls = worker_class(ray, vspec.cards_per_worker, vspec.gpus)
    device = "cuda" if vspec.gpus else "cpu"
    spec = ctx.spec.to_dict()
    outputs = os.path.join(ctx.run_dir, "outputs")
    path = list(sys.path)
    return lambda key: cls.remote(spec, outputs, path, device, shard_prefix(attempt, key))


def start_workers(ctx: StageContext, ray: Any, vspec: Any, cpu_workers: int,
                  spawn: Callable[[int], Any]) -> List[Worker]:
    """The volume's first workers, each answered where it runs (told as
    ``volume.workers``); one that fails to load the handler fails the stage."""
    count = vspec.workers or worker_count(ray, vspec, cpu_workers)
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


def worker_count(ray: Any, vspec: Any, cpu_workers: int) -> int:
    """How many workers the cluster offers: one per CPU (several nodes) or
    ``cpu_workers``, else ``cards_per_worker`` of each live node's cards each."""
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
