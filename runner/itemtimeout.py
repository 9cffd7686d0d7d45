"""The per-item timeout of an in-process handler (``task.item_timeout_s``).

A batch gets ``item_timeout_s`` seconds per item. The clock is a ``SIGALRM`` interval
timer: arming and disarming it is two system calls per batch, so a fast handler pays
nothing noticeable (bench/supervision.py), and an expired timer raises ``ItemTimedOut``
inside the handler, even inside ``time.sleep`` or a blocking read. A handler stuck in
native code that never returns to Python is not interrupted by it; the pilot stage's own
timeout (``diagnostics.timeouts.pilot``) then kills the worker and names the batch in
flight.

The timer works only in the main thread of the process (a Python rule for signals); the
pilot stage runs there in the watchdog's worker. Elsewhere the timer is off and says so.
Standard library only.
"""

from __future__ import annotations

import signal
import threading
from types import FrameType
from typing import Any, Callable, Optional

from runner.spec import RunSpec, batch_clock_s

DEFAULT_ITEM_TIMEOUT_S = 300.0


def item_timeout(spec: RunSpec) -> float:
    """The spec's ``task.item_timeout_s``, else the default."""
    value = getattr(spec.task, "item_timeout_s", DEFAULT_ITEM_TIMEOUT_S)
    return float(value) if isinstance(value, (int, float)) else DEFAULT_ITEM_TIMEOUT_S


def pilot_item_s(spec: RunSpec) -> float:
    """A volume's pilot p90 per item (its measured batch ÷ the batch size); 0 otherwise."""
    vspec = spec.volume
    if vspec is None or not vspec.pilot_batch_s:
        return 0.0
    size = max(1, int(vspec.batch_size or spec.task.batch_size or 1))
    return float(vspec.pilot_batch_s) / size


class ItemTimedOut(BaseException):
    """The handler outlived its time. A BaseException, so a handler's ``except Exception``
    cannot swallow it."""


class ItemClock:
    """Runs calls under a deadline of ``seconds`` (0 or less: no deadline)."""

    def __init__(self, per_item_s: float, pilot_item_s: float = 0.0) -> None:
        """``pilot_item_s``: a volume's worker, the pilot's p90 per item: a batch gets
        ``runner.spec.batch_clock_s`` (one item the timeout, the others a margin over the
        pilot's pace); 0: every item the timeout (the pilot)."""
        self.per_item_s = float(per_item_s or 0)
        self.pilot_item_s = float(pilot_item_s or 0)
        self.active = (self.per_item_s > 0 and hasattr(signal, "setitimer")
                       and threading.current_thread() is threading.main_thread())
        self._old: Any = None

    @property
    def why_off(self) -> Optional[str]:
        if self.active:
            return None
        if self.per_item_s <= 0:
            return "task.item_timeout_s is 0"
        return "the handler does not run in the main thread of its process"

    def __enter__(self) -> ItemClock:
        if self.active:
            self._old = signal.signal(signal.SIGALRM, _expired)
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._old or signal.SIG_DFL)

    def call(self, func: Callable[..., Any], items: int, *args: Any) -> Any:
        """``func(*args)`` with ``items * per_item_s`` seconds; ItemTimedOut past it."""
        if not self.active:
            return func(*args)
        signal.setitimer(signal.ITIMER_REAL,
                         batch_clock_s(max(1, items), self.per_item_s, self.pilot_item_s))
        try:
            return func(*args)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


def _expired(signum: int, frame: Optional[FrameType]) -> None:
    raise ItemTimedOut()
