"""What a task is handed to record its results: the ``ItemRecorder`` protocol.

The pilot stage's ``Recorder`` (runner/stages/pilot.py) is the implementation: it audits a
batch's results, commits them to the ledger, then emits their events. The ways a task runs
(a handler over batches, a command, the trainer, Blender's frames, the volume's Ray
workers) take this protocol instead of ``Any``, so mypy checks their calls without those
modules importing the stage that runs them. ``RecordWriter`` takes the recording off the
caller's thread (the volume's driver hands out work while it records). Standard library
only.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Callable, Iterable, Optional, Protocol, Set, Tuple

from runner.ledger import Ledger


class ItemRecorder(Protocol):
    @property
    def ledger(self) -> Ledger:
        """The run's ledger (its attempt number names a command's work directory)."""

    @property
    def recorded(self) -> Set[str]:
        """The ids recorded so far, this attempt's and the earlier ones'."""

    @property
    def total(self) -> int:
        """How many inputs the run has."""

    @property
    def outputs_dir(self) -> str:
        """Where accepted outputs go."""

    def record(self, asked: Iterable[str], results: Any,
               elapsed_s: Optional[float] = None) -> int:
        """Audit, commit, then emit the results of the items ``asked``; returns how many
        were recorded (a result that cannot be recorded becomes a ledger anomaly)."""

    def record_first_wins(self, asked: Iterable[str], results: Any,
                          elapsed_s: Optional[float] = None) -> Tuple[int, int]:
        """``record`` for items that may be recorded already: (recorded now, re-executed)."""


Job = Callable[[], Any]


class RecordWriter:
    """Recording on a thread of its own: jobs (a batch's ledger commit and its events, any
    other event) run one after another, in the order given, on one thread, which alone
    uses the ledger and the emitter until ``close``. So the caller never waits on the disk,
    and "durable before visible" still holds (a job commits, then emits).

    Bounded: ``put`` waits while ``limit`` jobs are queued (a disk that far behind holds the
    caller back rather than memory). The first job that raises stops the recording (later
    jobs are dropped: their items were not recorded, a resume runs them); ``error`` holds
    it for the caller to raise. ``close`` runs every job queued before it, then joins."""

    def __init__(self, limit: int = 1024, name: str = "recording") -> None:
        self._jobs: queue.Queue[Optional[Job]] = queue.Queue(maxsize=limit)
        self.error: Optional[BaseException] = None
        self.busy_s = 0.0  # seconds spent in jobs: what the caller did not wait for
        self.done = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def put(self, job: Job) -> None:
        self._jobs.put(job)

    def _loop(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if self.error is not None:
                continue
            t0 = time.perf_counter()
            try:
                job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                self.error = exc
            self.busy_s += time.perf_counter() - t0
            self.done += 1

    def pending(self) -> int:
        return self._jobs.qsize()

    def close(self) -> Optional[BaseException]:
        """Run what is queued, stop the thread; returns the first error, if any."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()
        return self.error
