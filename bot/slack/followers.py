"""One background thread per run being followed (the service records, then publishes)."""

from __future__ import annotations

import logging
import threading

from bot.errors import PreflightError, RunNotFound
from bot.service import PilotService

log = logging.getLogger(__name__)
RETRY_FIRST_S = 0.5  # a follower that fails waits this long, doubling up to RETRY_MAX_S
RETRY_MAX_S = 30.0


class Followers:
    def __init__(self, service: PilotService, *, poll: float = 0.1) -> None:
        self.service = service
        self.poll = poll
        self._stop = threading.Event()
        self._threads: dict[str, threading.Thread] = {}
        self._lock = threading.Lock()

    def follow(self, run_id: str) -> None:
        """Start following a run unless a thread already does."""
        with self._lock:
            if self._stop.is_set():
                return
            current = self._threads.get(run_id)
            if current is not None and current.is_alive():
                return
            thread = threading.Thread(target=self._follow, args=(run_id,),
                                      name=f"follow-{run_id}", daemon=True)
            self._threads[run_id] = thread
            thread.start()

    def resume_active(self) -> list[str]:
        """Follow again every run the store says is running (a restarted bot). Runs that
        finished while no bot followed are finished first, in the order they finished."""
        ids = [run.id for run in self.service.records.running()]
        done = set(self.service.follower.catch_up(ids))
        for run_id in ids:
            if run_id not in done:
                self.follow(run_id)
        return ids

    def wait(self, run_id: str, timeout: float) -> bool:
        """Block until the follower of ``run_id`` has ended; False on timeout."""
        with self._lock:
            thread = self._threads.get(run_id)
        if thread is None:
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop following (the runners keep running; a new bot picks them up)."""
        self._stop.set()
        with self._lock:
            threads = list(self._threads.values())
        for thread in threads:
            thread.join(timeout)

    def _follow(self, run_id: str) -> None:
        """Follow until the run stops running; a failure (a locked database, a flaky read)
        is logged and retried with a growing delay, so no run is left unfollowed."""
        delay = RETRY_FIRST_S
        while not self._stop.is_set():
            try:
                self.service.follower.follow(run_id, stop=self._stop, poll=self.poll)
                return
            except RunNotFound as exc:
                log.warning("following %s stopped: %s", run_id, exc)
                return
            except PreflightError as exc:
                log.warning("following %s failed (retrying in %.1f s): %s", run_id, delay, exc)
            except Exception:  # a follower must never take the bot down
                log.exception("following %s failed (retrying in %.1f s)", run_id, delay)
            self._stop.wait(delay)
            delay = min(delay * 2, RETRY_MAX_S)
