"""Scheduled jobs (APScheduler 3.11): the run watch, lease reminders, evidence reminders and
the state database's retention.

The jobs are the service's (``PilotService.watch_runs``, ``check_leases``,
``remind_evidence``, in ``bot.service.watch``; their messages in ``bot.messages.alerts``;
``prune_store``, bot/service/retention.py): this module only keeps them on a clock.

How the jobs are kept, and why:

- The job store is a SQLAlchemyJobStore in its own SQLite file (``settings.jobs_db_path``),
  apart from the state database, so the scheduler's writes never wait on the service's.
  Only one scheduler may use a job store: ``BotScheduler.start`` takes an exclusive lock
  file beside it and refuses to start a second one.
- Jobs are referenced by import path (``bot.schedule:watch_job``) with fixed ids and
  ``replace_existing=True``: a restarted bot finds the same jobs, never duplicates.
- Job arguments are pickled into the store, so the jobs take none: each job acts through
  the service installed with ``install``. No client, token or connection is ever pickled.
- ``coalesce=True``: after a pause (bot stopped, machine asleep) a job that missed several
  runs runs once, not once per missed run. ``misfire_grace_time=None``: a missed run is
  executed however late (APScheduler's default, one second, would silently drop reminders
  missed during a restart). Lateness is harmless because every job decides from ``now``
  and from what the store says it already sent: each alert and reminder goes out once.
- The job functions take an explicit ``now`` (``watch_runs``, ``check_leases``,
  ``remind_evidence``); tests call them directly instead of waiting for a clock.
"""

from __future__ import annotations

import fcntl
import logging
import os
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import IO

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from bot.errors import PreflightError
from bot.messages.model import Message
from bot.service import PilotService
from bot.settings import Settings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class JobSpec:
    id: str
    func: str
    seconds: int
    # A daily job's first run, this long after each start: registering it again at a start
    # moves its next run, and a bot restarted more often than daily would never reach it.
    first_after_s: int | None = None


JOBS = (
    JobSpec("preflight-watch", "bot.schedule:watch_job", 30),
    JobSpec("preflight-leases", "bot.schedule:leases_job", 300),
    JobSpec("preflight-evidence", "bot.schedule:evidence_job", 60),
    JobSpec("preflight-retention", "bot.schedule:retention_job", 86400, first_after_s=300),
)

_service: PilotService | None = None


def install(service: PilotService) -> None:
    """Make ``service`` the one the stored jobs act through (set before the scheduler runs)."""
    global _service
    _service = service


def _installed() -> PilotService:
    if _service is None:
        raise PreflightError("scheduled job ran before bot.schedule.install(service)")
    return _service


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# -- the entry points the job store refers to ----------------------------------------
def watch_job() -> None:
    watch_runs(_installed(), utcnow())


def leases_job() -> None:
    check_leases(_installed(), utcnow())


def evidence_job() -> None:
    remind_evidence(_installed(), utcnow())


def retention_job() -> None:
    prune_store(_installed(), utcnow())


# -- the jobs, as the service runs them ---------------------------------------------
def watch_runs(service: PilotService, now: datetime) -> list[Message]:
    """One watch pass (``Watch.watch_runs``, the service's watch)."""
    return service.watch.watch_runs(now)


def check_leases(service: PilotService, now: datetime) -> list[Message]:
    """The lease reminders and ends (``Watch.check_leases``)."""
    return service.watch.check_leases(now)


def remind_evidence(service: PilotService, now: datetime) -> list[Message]:
    """The evidence reminders (``Watch.remind_evidence``)."""
    return service.watch.remind_evidence(now)


def prune_store(service: PilotService, now: datetime) -> int:
    """The daily retention pass (``PilotService.prune_store``, PREFLIGHT_RETENTION_DAYS;
    0 prunes nothing); how many runs it pruned."""
    result = service.retention.prune(now=now)
    if result.runs:
        log.info("retention: pruned the item rows of %d run(s) ended over %g days ago",
                 len(result.runs), result.older_than_days)
    return len(result.runs)


# -- the scheduler -------------------------------------------------------------------
class BotScheduler:
    """A BackgroundScheduler on the SQLite job store, with the four jobs registered."""

    def __init__(self, settings: Settings, service: PilotService, *,
                 jobs: tuple[JobSpec, ...] = JOBS) -> None:
        self.path = Path(settings.jobs_db_path)
        self.service = service
        self.jobs = jobs
        self._lock: IO[str] | None = None
        self.scheduler = BackgroundScheduler(
            jobstores={"default": SQLAlchemyJobStore(url=f"sqlite:///{self.path}")},
            job_defaults={"coalesce": True, "misfire_grace_time": None, "max_instances": 1},
            timezone=timezone.utc)

    def start(self, *, paused: bool = False, register: bool = True) -> None:
        """Start on the job store; ``register=False`` only restores what the store holds."""
        self._take_lock()
        install(self.service)
        try:
            self.scheduler.start(paused=paused)
            for job in self.jobs if register else ():
                first = {} if job.first_after_s is None else {
                    "next_run_time": utcnow() + timedelta(seconds=job.first_after_s)}
                self.scheduler.add_job(job.func, "interval", seconds=job.seconds, id=job.id,
                                       replace_existing=True, coalesce=True,
                                       misfire_grace_time=None, max_instances=1, **first)
        except Exception:
            self._release_lock()
            raise

    def job_ids(self) -> list[str]:
        return sorted(job.id for job in self.scheduler.get_jobs())

    def shutdown(self) -> None:
        if self.scheduler.running:
            self.scheduler.shutdown(wait=True)
        for store in self.scheduler._jobstores.values():
            store.shutdown()
        self._release_lock()

    def _take_lock(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fh = open(f"{self.path}.lock", "a+", encoding="utf-8")
        except OSError as exc:
            raise PreflightError(f"cannot open the job store lock {self.path}.lock: {exc}") from exc
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            fh.close()
            raise PreflightError(
                f"another bot already runs the scheduler on {self.path} (only one process may "
                "use a job store); stop it first") from exc
        fh.seek(0)
        fh.truncate()
        fh.write(f"{os.getpid()}\n")
        fh.flush()
        self._lock = fh

    def _release_lock(self) -> None:
        if self._lock is not None:
            fcntl.flock(self._lock.fileno(), fcntl.LOCK_UN)
            self._lock.close()
            self._lock = None
