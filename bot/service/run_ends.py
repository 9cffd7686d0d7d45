"""Runs being ended off the follower's thread: their results fetched, judged, published.

A run's end fetches its results from its node, which takes as long as its evidence takes
to cross (minutes for a million outputs). The follower (a Slack follower thread, the
scheduled watch pass over every running run) hands the end to ``RunEnds`` and goes on
reading events of this run and others; ``follow`` waits for the end's verdict; the run
stays ``running`` until the end has recorded it. One end per run at a time: a second
``start`` while one is under way is the same end.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

log = logging.getLogger(__name__)

WORKERS = 4  # runs ended at once (each mostly waits on its node's stream)


class RunEnds:
    """Ends of runs, each on a worker thread; an end that raised is logged, and raised
    again to whoever waits for it."""

    def __init__(self, workers: int = WORKERS) -> None:
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="run-end")
        self._ends: dict[str, Future[None]] = {}
        self._lock = threading.Lock()

    def start(self, run_id: str, end: Callable[[str], None]) -> None:
        """``end(run_id)`` on a worker, unless that run's end is under way already."""
        with self._lock:
            under_way = self._ends.get(run_id)
            if under_way is not None and not under_way.done():
                return
            self._ends[run_id] = self._pool.submit(_logged, end, run_id)

    def busy(self, run_id: str) -> bool:
        """Whether the run's end is under way (its results being fetched)."""
        with self._lock:
            under_way = self._ends.get(run_id)
        return under_way is not None and not under_way.done()

    def pending(self, run_id: str) -> bool:
        """Whether the run has an end nobody has waited for yet (under way, or over)."""
        with self._lock:
            return run_id in self._ends

    def wait(self, run_id: str, timeout: float | None = None) -> bool:
        """Wait ``timeout`` seconds at most for the run's end (None: until it is over);
        True once it is over (re-raising what it raised), False while it goes on."""
        with self._lock:
            under_way = self._ends.get(run_id)
        if under_way is None:
            return True
        try:
            under_way.result(timeout)
        except FutureTimeout:
            return False
        finally:
            if under_way.done():
                with self._lock:
                    if self._ends.get(run_id) is under_way:
                        del self._ends[run_id]
        return True

    def close(self) -> None:
        """No new end; those under way finish first."""
        self._pool.shutdown(wait=True)


def _logged(end: Callable[[str], None], run_id: str) -> None:
    try:
        end(run_id)
    except Exception:
        log.exception("ending run %s failed", run_id)
        raise
