"""The volume driver's queue of batches: hand out, put back, split, refuse.

Pure bookkeeping (no Ray, no I/O), so the driver's rules are tested on their own
(tests/runner/test_volume_queue.py):

- a batch whose worker was lost with its node (or killed from outside), or that waited
  behind the batch its worker died running, goes back to the front of the queue, whole,
  counted against none of its inputs (``put_back``);
- a batch that failed because of what it holds is split, at the front: one that ran past
  ``task.item_timeout_s`` on its worker, or that its worker held past the batch timeout
  (a hang), into batches of one input each (one more item timeout finds the input that
  hangs, the others run beside it); one whose handler raised, or whose worker's process
  died running it while its node lived, in two halves, until the input that fails is
  alone in its batch;
- what the failed call left is used (``runner/handler_call.py``): the inputs whose
  results a generator handler yielded before it failed were recorded by the driver and
  leave the batch (``kept``); the input the handler was working on when it raised or was
  interrupted (``suspect``) is tried alone at once, the rest of the batch goes back as one
  batch, not halved. A lineage that used ``HINTS_MAX`` suspects goes on by halves (a
  handler whose iteration misleads costs a bounded number of rounds);
- an input alone in a failed batch is refused with the reason (the exception, the
  timeout); one whose worker died under it is tried once more first (a worker may die of
  something else), then refused.

Every input leaves the queue exactly once: recorded by the driver from a result, or
returned by :meth:`BatchQueue.failed` as a refusal. Standard library only.
"""

from __future__ import annotations

import collections
import os
from dataclasses import dataclass
from typing import Any, Collection, Deque, Dict, List, Optional, Tuple

from runner.inputs import Item
from runner.spec import batch_clock_s

RAISED, TIMEOUT, LATE, DIED = "raised", "timeout", "late", "died"
CAUSES = (RAISED, TIMEOUT, LATE, DIED)
DEATHS_BEFORE_REFUSAL = 2  # an input alone whose worker died this often is refused
SPLIT_PARTS = 4  # a failed batch that tells nothing of its bad input: split in this many
HINTS_MAX = 4  # suspect splits in one batch's lineage before it is split blind again
MIN_TIMEOUT_S = 60.0
TIMEOUT_FACTOR = 10.0
ITEM_GRACE_S = 10.0  # the batch timeout waits this beyond a batch's item clock


@dataclass
class Batch:
    n: int
    items: List[Item]
    sent: int = 0  # times handed out
    deaths: int = 0  # times a worker died while it held this batch (its node alive)
    hints: int = 0  # suspect splits in its lineage (``BatchQueue.failed``)

    def payload(self, root: str) -> List[List[Any]]:
        """Each item's path relative to the inputs root: a worker resolves it against its
        own node's copy of the inputs (``runner.volume_ray._Worker``)."""
        return [[it.id, os.path.relpath(it.path, root), it.size] for it in self.items]


@dataclass(frozen=True)
class Split:
    """What :meth:`BatchQueue.failed` did with a failed batch."""

    parts: Tuple[int, ...]  # the numbers of the batches it became (none: refused or retried)
    refused: Tuple[Tuple[str, str], ...] = ()  # (id, reason) of an input refused
    retried: bool = False  # put back whole (an input alone whose worker died once)


class BatchQueue:
    """The batches not yet handed out, first in first out; failed ones at the front."""

    def __init__(self, batches: List[Batch]) -> None:
        self.queue: Deque[Batch] = collections.deque(batches)
        self.next_n = max((b.n for b in batches), default=-1) + 1
        self.splits = 0
        self.refused: Dict[str, str] = {}
        # read ahead (``volume.prefetch``): batches promised to a worker, by its key, in
        # the order it runs them; still to hand out, so counted in len()
        self.reserved: Dict[int, Deque[Batch]] = {}

    def __len__(self) -> int:
        return len(self.queue) + sum(len(r) for r in self.reserved.values())

    def __bool__(self) -> bool:
        return bool(self.queue) or any(self.reserved.values())

    def take(self, key: Optional[int] = None, *, steal: bool = False) -> Optional[Batch]:
        """The next batch: worker ``key``'s first reserved one, else the front of the
        queue, else (``steal``: the worker is idle) the last batch reserved for another
        worker, so the end of a volume never waits on a promise. None: nothing for it."""
        mine = self.reserved.get(key) if key is not None else None
        if mine:
            batch = mine.popleft()
        elif self.queue:
            batch = self.queue.popleft()
        elif steal and any(self.reserved.values()):
            batch = max(self.reserved.values(), key=len).pop()
        elif key is None:
            raise IndexError("take from an empty queue")
        else:
            return None
        batch.sent += 1
        return batch

    def reserve(self, key: int, count: int) -> List[Batch]:
        """Worker ``key``'s next ``count`` batches, taken from the front and kept for it:
        it reads their files ahead while it runs the one it was handed."""
        mine = self.reserved.setdefault(key, collections.deque())
        while len(mine) < count and self.queue:
            mine.append(self.queue.popleft())
        return list(mine)

    def release(self, key: int) -> None:
        """A lost or excluded worker's reserved batches back to the front, in order."""
        self.queue.extendleft(reversed(self.reserved.pop(key, ())))

    def put_back(self, batch: Batch) -> None:
        """A lost worker's (or node's) batch: whole, at the front, for another worker;
        not a death of its inputs (``deaths`` stays as it was)."""
        self.queue.appendleft(batch)

    def failed(self, batch: Batch, cause: str, reason: str, *,
               kept: Collection[str] = (), suspect: Optional[str] = None) -> Split:
        """A batch that failed for ``cause`` (one of ``CAUSES``) with ``reason``: split it,
        retry it or refuse its one input. ``kept``: ids of it already recorded from what
        the failed call yielded; ``suspect``: the id it was working on when it failed."""
        if cause not in CAUSES:
            raise ValueError(f"unknown cause {cause!r}")
        if cause == DIED:
            batch.deaths += 1
        rest = [it for it in batch.items if it.id not in kept]
        if not rest:  # every input has its result: nothing is left to find
            return Split(())
        if len(batch.items) > 1:
            parts = [Batch(self._number(), items, deaths=0, hints=hints)
                     for items, hints in self._parts(batch, rest, cause, suspect)]
            self.queue.extendleft(reversed(parts))
            self.splits += 1
            return Split(tuple(p.n for p in parts))
        if cause == DIED and batch.deaths < DEATHS_BEFORE_REFUSAL:
            self.queue.appendleft(batch)
            return Split((), retried=True)
        item = batch.items[0]
        self.refused[item.id] = reason
        return Split((), refused=((item.id, reason),))

    @staticmethod
    def _parts(batch: Batch, rest: List[Item], cause: str,
               suspect: Optional[str]) -> List[Tuple[List[Item], int]]:
        """The items of each part of a failed batch and their lineage's suspect count."""
        alone = [it for it in rest if it.id == suspect]
        if alone and len(rest) > 1 and batch.hints < HINTS_MAX and cause in (RAISED, TIMEOUT):
            # the suspect alone confirms it; those the handler took before it (it raised
            # on none of them) and those it never reached: a batch each, so a second bad
            # input among the latter does not run the former a third time
            at = rest.index(alone[0])
            return [(alone, 0)] + [(part, batch.hints + 1)
                                   for part in (rest[:at], rest[at + 1:]) if part]
        # a hang: each input alone (one more item timeout finds it, the others run beside
        # it); else quarters: as many calls as halving to find it (4 x log4 = 2 x log2), a
        # third fewer executions, half the deaths of a worker that dies of it
        size = 1 if cause in (TIMEOUT, LATE) else -(-len(rest) // SPLIT_PARTS)
        return [(rest[i:i + size], batch.hints) for i in range(0, len(rest), size)]

    def _number(self) -> int:
        self.next_n += 1
        return self.next_n - 1


def refusal_reason(cause: str, detail: str, *, item_timeout_s: float = 0.0,
                   batch_timeout_s: float = 0.0) -> str:
    """The reason an input alone in a failed batch is refused with (balance, ledger)."""
    if cause == TIMEOUT:
        return (f"timeout: no result within task.item_timeout_s = {item_timeout_s:g} s "
                "(the handler was interrupted on its worker)")
    if cause == LATE:
        return (f"timeout: its worker held it past the volume's batch timeout of "
                f"{batch_timeout_s:.0f} s (the worker was excluded and stopped)")
    if cause == DIED:
        return (f"its worker died {DEATHS_BEFORE_REFUSAL} times while running it alone: "
                f"{detail}")
    return detail


def batch_timeout(items: int, slowest: float, item_timeout_s: float,
                  pilot_item_s: float) -> float:
    """The batch timeout of a batch of ``items`` (no fixed one in the spec): ten times the
    slowest batch (the pilot's measure before any batch finished), at least 60 s, and never
    before the batch's item clock (``runner.spec.batch_clock_s``) could interrupt it on its
    worker, plus a grace: the interrupt keeps the worker, the timeout stops it."""
    clock = batch_clock_s(items, item_timeout_s, pilot_item_s)
    clock = clock + ITEM_GRACE_S if clock > 0 else 0.0
    return max(MIN_TIMEOUT_S, TIMEOUT_FACTOR * slowest, clock)
