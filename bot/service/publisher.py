"""What the service publishes: a run's thread, rendered from the store and posted.

``Publisher`` holds the notifier, the per-run message locks and the progress meters; it
renders a run's thread (the status, cards, volume notes and progress messages, the outcome
and the report) and publishes each message through the notifier; a transport failure is
logged, never allowed to lose the recorded state. ``PilotService`` and its ``Follower``
share one.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from typing import Any

from bot.errors import PreflightError
from bot.messages import views
from bot.messages.cards import cards_message
from bot.messages.forecast_view import forecast_message, proven_message
from bot.messages.model import Attachment, Message, Notifier
from bot.messages.progress import ProgressMeter
from bot.messages.volume_view import NOTE_TYPES as VOLUME_NOTES
from bot.messages.volume_view import volume_message
from bot.pilot.states import ENDED, S
from bot.service.report_files import PICTURE, REPORT, ReportFiles, write_report
from bot.store import Run, Store

log = logging.getLogger(__name__)


class Publisher:
    """Renders and posts a run's messages; each is read from the store when published."""

    def __init__(self, store: Store, notifier: Notifier, *,
                 progress_interval: float = 0.2) -> None:
        self.store = store
        self.notifier = notifier
        self.progress_interval = progress_interval
        self._progress: dict[str, ProgressMeter] = {}
        self._status_base: dict[str, tuple[Run, list[dict[str, Any]]]] = {}
        self._last_progress_post: dict[str, float] = {}
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}

    def thread_messages(self, run_id: str, run: Run | None = None) -> list[Message]:
        """Every message of the run's thread as it stands now (for re-rendering); ``run``:
        the run as this step read it (else read here), carried to every message."""
        run = run if run is not None else self.store.run(run_id)
        out: list[Message | None] = [views.plan_message(run), self.status(run_id, run=run),
                                     cards_message(run, self.store.stages(run_id)),
                                     self.volume_notes(run), proven_message(run)]
        if run.status == S.DISPATCH_FAILED or views.lease_refused(run):
            out.append(views.first_error_message(run))
        if run.status in ENDED:
            out += [views.first_error_message(run), views.balance_message(run, balance_csv_of(run)),
                    views.evidence_message(run), with_report(views.verdict_message(run), run),
                    forecast_message(run),
                    views.decision_message(run.joined(volume_run=self.store.volume_of(run_id)),
                                           self.store.decisions(run_id))]
        return [m for m in out if m is not None]

    def run_lock(self, run_id: str) -> threading.Lock:
        """The run's own lock: its outcome and a decision on it are published in order."""
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def status(self, run_id: str, *, cached: bool = False, run: Run | None = None) -> Message:
        """The status message; ``cached``: the run and stages as last read (a progress
        update changes only the counts, so it reads nothing from the store); ``run``: the
        run as the caller's step read it."""
        base = self._status_base.get(run_id) if cached else None
        if base is None:
            base = self._status_base[run_id] = (
                run if run is not None else self.store.run(run_id), self.store.stages(run_id))
        meter = self._progress.get(run_id)
        return views.status_message(*base, meter.block() if meter else None)

    def note_progress(self, run_id: str, done: int, total: int, pace: str) -> None:
        """The runner's latest progress count, for the next status message."""
        meter = self._progress.setdefault(run_id, ProgressMeter())
        meter.update(done, total, time.monotonic(), pace)

    def forget(self, run_id: str) -> None:
        """A run that ended: its progress meter and cached status are dropped."""
        self._progress.pop(run_id, None)
        self._status_base.pop(run_id, None)

    def publish_status(self, run_id: str) -> None:
        self._last_progress_post[run_id] = time.monotonic()
        self.publish(self.status(run_id))

    def publish_cards(self, run_id: str) -> None:
        message = cards_message(self.store.run(run_id), self.store.stages(run_id))
        if message is not None:
            self.publish(message)

    def volume_notes(self, run: Run) -> Message | None:
        return volume_message(run, [e for etype in VOLUME_NOTES
                                    for e in self.store.events_of_type(run.id, etype)])

    def publish_volume(self, run_id: str) -> None:
        message = self.volume_notes(self.store.run(run_id))
        if message is not None:
            self.publish(message)

    def maybe_publish_progress(self, run_id: str) -> None:
        if time.monotonic() - self._last_progress_post.get(run_id, 0.0) >= self.progress_interval:
            self._last_progress_post[run_id] = time.monotonic()
            self.publish(self.status(run_id, cached=True))

    def publish_outcome(self, run_id: str) -> None:
        """The report written, then every message of the thread after the plan: the run
        read once, and that one ``Run`` carried to the report and every message."""
        run = self.store.run(run_id)
        self.write_report(run_id, run=run)  # every run that ended has one, however it ended
        for message in self.thread_messages(run_id, run)[1:]:
            self.publish(message)

    def write_report(self, run_id: str, *, strict: bool = False,
                     run: Run | None = None) -> ReportFiles | None:
        """(Re)write the run's report.html and picture; a failure is logged, never fatal
        to the run (``strict`` raises it instead, for `preflight report`). ``run``: the
        run as the caller's step read it."""
        try:
            return write_report(self.store, run_id, run)
        except Exception:
            if strict:
                raise
            log.exception("writing the report of run %s failed", run_id)
            return None

    def publish(self, message: Message) -> None:
        try:
            self.notifier.publish(message)
        except PreflightError:
            raise
        except Exception:  # a transport failure must never lose the recorded state
            log.exception("publishing %s of run %s failed", message.key, message.run_id)


def with_report(message: Message, run: Run) -> Message:
    """The verdict with the report and its picture attached (uploaded to the thread)."""
    files = [Attachment(str(run.run_dir / name), name) for name in (REPORT, PICTURE)
             if (run.run_dir / name).is_file()]
    return replace(message, blocks=message.blocks + tuple(files)) if files else message


def balance_csv_of(run: Run) -> str | None:
    path = run.run_dir / "balance.csv"
    return str(path) if path.exists() else None
