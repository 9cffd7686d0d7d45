"""What the service publishes, and the helpers every part of it shares.

``Publishing`` holds the service's state (settings, store, dispatchers, notifier, policy
guard) and renders a run's thread: the status, cards, volume notes and progress messages,
each published through the notifier; a transport failure is logged, never allowed to lose
the recorded state.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot.dispatch.base import Dispatcher, RunHandle
from bot.errors import (
    DispatchError,
    PreflightError,
)
from bot.guard import PolicyGuard
from bot.messages import views
from bot.messages.cards import cards_message
from bot.messages.forecast_view import forecast_message
from bot.messages.model import Attachment, Message, Notifier
from bot.messages.progress import ProgressMeter
from bot.messages.volume_view import NOTE_TYPES as VOLUME_NOTES
from bot.messages.volume_view import volume_message
from bot.pilot.states import ENDED, S
from bot.records import Records
from bot.settings import Settings
from bot.store import Store

log = logging.getLogger(__name__)


class Publishing(Records):
    """The service's state and its messages; ``PilotService`` builds it."""

    settings: Settings
    store: Store
    guard: PolicyGuard
    dispatchers: dict[str, Dispatcher]
    notifier: Notifier
    progress_interval: float
    _progress: dict[str, ProgressMeter]
    _status_base: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]]
    _finish_checked: set[str]
    _last_progress_post: dict[str, float]
    _lock: threading.Lock
    _run_locks: dict[str, threading.Lock]

    def thread_messages(self, run_id: str) -> list[Message]:
        """Every message of the run's thread as it stands now (for re-rendering)."""
        run = self.store.get_run(run_id)
        out: list[Message | None] = [views.plan_message(run), self._status(run_id),
                                     cards_message(run, self.store.stages(run_id)),
                                     self._volume_notes(run)]
        if run["status"] == S.DISPATCH_FAILED:
            out.append(views.first_error_message(run))
        if run["status"] in ENDED:
            out += [views.first_error_message(run), views.balance_message(run, balance_csv_of(run)),
                    views.evidence_message(run), with_report(views.verdict_message(run), run),
                    forecast_message(run),
                    views.decision_message({**run, "volume_run": self.store.volume_of(run_id)},
                                           self.store.decisions(run_id))]
        return [m for m in out if m is not None]

    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def _dispatcher(self, run: dict[str, Any]) -> Dispatcher:
        kind = (run.get("node") or {}).get("kind", "local")
        try:
            return self.dispatchers[kind]
        except KeyError as exc:
            raise DispatchError(f"node.kind {kind!r}: no dispatcher configured for it "
                                f"(available: {', '.join(sorted(self.dispatchers))})") from exc

    def _handle(self, run: dict[str, Any], *, resume: bool = False) -> RunHandle:
        spec_path = Path(run["spec_path"])
        return RunHandle(run_id=run["id"], run_dir=Path(run["run_dir"]), spec_path=spec_path,
                         project_dir=Path(project_dir_of(run)), pid=run.get("pid"), resume=resume,
                         node=run.get("node"))

    def _status(self, run_id: str, *, cached: bool = False) -> Message:
        """The status message; ``cached``: the run and stages as last read (a progress
        update changes only the counts, so it reads nothing from the store)."""
        base = self._status_base.get(run_id) if cached else None
        if base is None:
            base = self._status_base[run_id] = (self.store.get_run(run_id),
                                                self.store.stages(run_id))
        meter = self._progress.get(run_id)
        return views.status_message(*base, meter.block() if meter else None)

    def _publish_status(self, run_id: str) -> None:
        self._last_progress_post[run_id] = time.monotonic()
        self._publish(self._status(run_id))

    def _publish_cards(self, run_id: str) -> None:
        message = cards_message(self.store.get_run(run_id), self.store.stages(run_id))
        if message is not None:
            self._publish(message)

    def _volume_notes(self, run: dict[str, Any]) -> Message | None:
        return volume_message(run, [e for etype in VOLUME_NOTES
                                    for e in self.store.events_of_type(run["id"], etype)])

    def _publish_volume(self, run_id: str) -> None:
        message = self._volume_notes(self.store.get_run(run_id))
        if message is not None:
            self._publish(message)

    def _maybe_publish_progress(self, run_id: str) -> None:
        if time.monotonic() - self._last_progress_post.get(run_id, 0.0) >= self.progress_interval:
            self._last_progress_post[run_id] = time.monotonic()
            self._publish(self._status(run_id, cached=True))

    def _publish(self, message: Message) -> None:
        try:
            self.notifier.publish(message)
        except PreflightError:
            raise
        except Exception:  # a transport failure must never lose the recorded state
            log.exception("publishing %s of run %s failed", message.key, message.run_id)


def with_report(message: Message, run: dict[str, Any]) -> Message:
    """The verdict with the report and its picture attached (uploaded to the thread)."""
    from bot.reporting import PICTURE, REPORT

    files = [Attachment(str(Path(run["run_dir"]) / name), name) for name in (REPORT, PICTURE)
             if (Path(run["run_dir"]) / name).is_file()]
    return replace(message, blocks=message.blocks + tuple(files)) if files else message


def new_run_id(name: str, attempt: int, kind: str = "pilot") -> str:
    """Time-sortable and unique: ``20261202T140501123Z-pilote-demo-a1``."""
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    return f"{stamp}-{name}-{'v' if kind == 'volume' else 'a'}{attempt}"


def now_utc() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def base_dir_of(run: dict[str, Any]) -> Path:
    return Path(run["base_dir"])


def project_dir_of(run: dict[str, Any]) -> str:
    return str(run["project_dir"])


def balance_csv_of(run: dict[str, Any]) -> str | None:
    path = Path(run["run_dir"]) / "balance.csv"
    return str(path) if path.exists() else None
