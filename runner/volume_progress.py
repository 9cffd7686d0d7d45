"""The volume's progress as the driver tells it: a ``progress`` event at most once a
second (items done, rate, ETA, batches held, the per-worker rates every 30 s or when the
workers change) and, from the measured rate, the stage's time limit widened when the
items run slower than the forecast said (``runner/volume_limit.py``)."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from runner import events as ev
from runner.volume_limit import AdaptiveLimit
from runner.volume_workers import Worker

PROGRESS_EVERY_S = 1.0
PER_WORKER_EVERY_S = 30.0  # the per-worker rates ride on a progress event this seldom ...
# ... or when the workers change (80 workers: about 3 KB a line)


class Progress:
    """The pass's clock and counts: ``total`` items, ``start_done`` recorded before it."""

    def __init__(self, vspec: Any, total: int, start_done: int,
                 clock: Callable[[], float]) -> None:
        self.clock, self.total, self.start_done = clock, total, start_done
        self.t0 = clock()
        self.last = 0.0
        self.last_per_card = -PER_WORKER_EVERY_S
        self.per_card_workers: List[str] = []
        self.limit = AdaptiveLimit.from_spec(vspec, clock=clock)

    def due(self, force: bool = False) -> Optional[float]:
        """Now, if a progress event is due (or ``force``); else None."""
        now = self.clock()
        if not force and now - self.last < PROGRESS_EVERY_S:
            return None
        self.last = now
        return now

    def rate(self, done: int, now: Optional[float] = None) -> float:
        """Items recorded a second over the pass."""
        now = self.clock() if now is None else now
        return (done - self.start_done) / max(now - self.t0, 1e-6)

    def events(self, now: float, done: int, usable: List[Worker],
               held: List[Tuple[float, float]], force: bool = False
               ) -> List[Tuple[str, Dict[str, Any]]]:
        """The ``progress`` event (``done`` items recorded, ``held``: the driver's
        ``held``), and a ``volume.limit`` one when the limit is widened."""
        elapsed = max(now - self.t0, 1e-6)
        rate = self.rate(done, now)
        per_card: Dict[str, Any] = {}
        labels = [w.label for w in usable]
        if force or labels != self.per_card_workers \
                or now - self.last_per_card >= PER_WORKER_EVERY_S:
            self.last_per_card, self.per_card_workers = now, labels
            per_card["per_card"] = {w.label: round(w.done / max(now - w.started, 1e-6), 2)
                                    for w in usable}
        out: List[Tuple[str, Dict[str, Any]]] = [(ev.PROGRESS, dict(
            done=done, total=self.total, items_per_s=round(rate, 2),
            eta_s=round((self.total - done) / rate, 1) if rate > 0 else None,
            held=len(held), held_s=round(held[0][0], 1) if held else None,
            held_limit_s=round(held[0][1], 1) if held else None,
            workers=len(usable), running_s=round(elapsed, 3), **per_card))]
        widened = self.limit.check(done - self.start_done, self.total - done, self.total)
        if widened is not None:  # the watchdog moves the stage's deadline with it
            out.append((ev.VOLUME_LIMIT, widened))
        return out
