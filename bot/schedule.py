"""Scheduled jobs (APScheduler 3.11): the run watch, lease reminders, evidence reminders.

How the jobs are kept, and why:

- The job store is a SQLAlchemyJobStore in its own SQLite file (``settings.jobs_db_path``),
  apart from the state database, so the scheduler's writes never wait on the service's.
  Only one scheduler may use a job store: ``BotScheduler.start`` takes an exclusive lock
  file beside it and refuses to start a second one.
- Jobs are referenced by import path (``bot.schedule:watch_job``) with fixed ids and
  ``replace_existing=True``: a restarted bot finds the same jobs, never duplicates.
- Job arguments are pickled into the store, so the jobs take none: each job reads what it
  needs (run ids, leases) from the state database through the service installed with
  ``install``. No client, token or connection is ever pickled.
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
from typing import IO, Any

from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
from apscheduler.schedulers.background import BackgroundScheduler

from bot.errors import PreflightError
from bot.messages.model import Fields, Heading, Message, Text
from bot.pilot import leases as lease_rules
from bot.pilot.states import S
from bot.service import PilotService
from bot.settings import Settings

log = logging.getLogger(__name__)

EVIDENCE_AFTER = timedelta(minutes=30)
DEFAULT_STALL_S = 600


@dataclass(frozen=True)
class JobSpec:
    id: str
    func: str
    seconds: int


JOBS = (
    JobSpec("preflight-watch", "bot.schedule:watch_job", 30),
    JobSpec("preflight-leases", "bot.schedule:leases_job", 300),
    JobSpec("preflight-evidence", "bot.schedule:evidence_job", 60),
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


# -- watch ---------------------------------------------------------------------------
def watch_runs(service: PilotService, now: datetime) -> list[Message]:
    """One watch pass: pump each active run, alert a stall once, announce a return once."""
    store = service.store
    sent: list[Message] = []
    for run in store.list_runs(status=S.DISPATCHING):
        try:  # a start its bot never finished: running if the runner started, else failed
            service.reap(run["id"], now=now)
        except PreflightError as exc:
            log.warning("watch of %s: %s", run["id"], exc)
    ids = [r["id"] for r in store.active_runs()]
    ids += [w["run"] for w in store.stalled_runs() if w["run"] not in ids]
    for run_id in ids:
        try:
            message = _watch_one(service, run_id, now)
        except PreflightError as exc:  # one unreachable node must not stop the others
            log.warning("watch of %s: %s", run_id, exc)
            continue
        except Exception:  # nor one run's unexpected failure: logged with its traceback
            log.exception("watch of %s failed", run_id)
            continue
        if message is not None:
            _publish(service, message)
            sent.append(message)
    return sent


def _watch_one(service: PilotService, run_id: str, now: datetime) -> Message | None:
    store = service.store
    if store.get_run(run_id)["status"] == S.RUNNING:
        service.reap(run_id)  # pumps; closes the run if its runner ended unseen
    run = store.get_run(run_id)
    stamp = _iso(now)
    first = _first_seen(run, now)
    state = store.observe_run(run_id, int(run["last_seq"]), stamp, _iso(first))
    quiet = now - lease_rules.parse_time(state["seen_at"])
    if state["stalled"]:
        seen = lease_rules.parse_time(state["seen_at"])
        alerted = lease_rules.parse_time(state["alerted_at"])
        if seen > alerted and store.mark_recovered(run_id, stamp):
            return recovered_message(run, quiet_since=state["alerted_at"])
        return None
    if run["status"] != S.RUNNING:
        return None
    stall_after = timedelta(seconds=_stall_after(run))
    if quiet >= stall_after and store.mark_stalled(run_id, stamp):
        return stall_message(run, stall_after)
    return None


def _first_seen(run: dict[str, Any], now: datetime) -> datetime:
    for key in ("last_event_at", "started_at"):
        if run.get(key):
            try:
                return min(lease_rules.parse_time(str(run[key])), now)
            except ValueError:
                continue
    return now


def _stall_after(run: dict[str, Any]) -> int:
    node = run.get("node") or {}
    try:
        return int(node.get("stall_after_s") or DEFAULT_STALL_S)
    except (TypeError, ValueError):
        return DEFAULT_STALL_S


def stall_message(run: dict[str, Any], after: timedelta) -> Message:
    stage = run.get("stage_reached") or "(none yet)"
    last = run.get("last_event_at") or "(no event yet)"
    minutes = int(after.total_seconds() // 60)
    text = (f"No event from run {run['id']} for {minutes} min or more "
            f"(stall_after {int(after.total_seconds())} s). Last stage: {stage}; "
            f"last event at {last}.")
    return Message(run["id"], key="alert-stall", summary=text, blocks=(
        Heading("Run stalled?"), Text(text, style="warn"),
        Fields((("last stage", stage), ("last event", last))),
        Text("The runner keeps going on its own; check the node (is the process stopped? "
             "out of memory? the SSH route down?). A return is announced here.", style="muted")))


def recovered_message(run: dict[str, Any], *, quiet_since: str | None) -> Message:
    stage = run.get("stage_reached") or "(none yet)"
    text = (f"Run {run['id']} is reporting again (stage {stage}, last event at "
            f"{run.get('last_event_at')}).")
    return Message(run["id"], key="alert-recovered", summary=text, blocks=(
        Heading("Run back"), Text(text, style="ok"),
        Fields((("stalled since", quiet_since or "?"), ("status", str(run.get("status")))))))


# -- leases --------------------------------------------------------------------------
def check_leases(service: PilotService, now: datetime) -> list[Message]:
    """Post the 24 h / 2 h reminders once each, and end leases at expiry."""
    store = service.store
    sent: list[Message] = []
    for lease in store.leases(include_ended=False):
        for action in lease_rules.due_actions(lease, now):
            host, port = lease_rules.split_key(action.node)
            runs = store.runs_on_node(host, port, since=lease.get("created_at"))
            pending = lease_rules.unsecured(runs)
            if action.kind == "end":
                if not store.change_lease(action.lease_id, lease["state"], lease_rules.ENDED,
                                          lease_rules.SYSTEM, note="lease expired"):
                    continue
                _stop_runs_on(service, host, port, action.node)
            if not store.claim_reminder(action.key, f"lease-{action.kind}", action.node,
                                        {"pending": pending, "end": _iso(action.end)}):
                continue
            message = lease_message(action, runs, pending, now)
            _publish(service, message)
            sent.append(message)
    return sent


def _stop_runs_on(service: PilotService, host: str, port: int, node: str) -> None:
    """Nothing of ours keeps running on a node whose lease ended: every run using it (its
    runner, a volume's driver and Ray on every node of the volume) is stopped."""
    for run_id in service.store.running_on_node(host, port):
        try:
            service.stop(run_id, by=lease_rules.SYSTEM, reason=f"the lease of {node} ended",
                         wait=False)
        except PreflightError as exc:  # the next watch still closes what it can
            log.warning("run %s: not stopped at the end of the lease of %s: %s",
                        run_id, node, exc)


def lease_message(action: lease_rules.LeaseAction, runs: list[dict[str, Any]],
                  pending: list[str], now: datetime) -> Message:
    anchor = runs[-1]["id"] if runs else f"lease-{action.node}"
    end = _iso(action.end)
    if action.kind == "end":
        head, text = "Lease ended", f"The lease of {action.node} ended at {end}."
    else:
        left = action.end - now
        hours = max(0, int(left.total_seconds() // 3600))
        head = f"Lease ends in {action.hours} h"
        text = f"The lease of {action.node} ends at {end} (about {hours} h left)."
    lines = "\n".join(f"• {p}" for p in pending) if pending else "Everything is secured."
    return Message(anchor, key=f"alert-lease-{action.kind}-{action.hours or 'end'}",
                   summary=f"{text} Not yet secured: {len(pending)}.", blocks=(
                       Heading(head), Text(text, style="warn"),
                       Text(("Not yet secured:\n" + lines) if pending else lines,
                            style="warn" if pending else "ok"),
                       Text("A file on the compute machine is not a backup: copy and verify "
                            "the evidence before the end.", style="muted")))


# -- evidence ------------------------------------------------------------------------
def remind_evidence(service: PilotService, now: datetime) -> list[Message]:
    """One reminder per pilot whose balance is 30 min old and whose evidence is unverified."""
    store = service.store
    sent: list[Message] = []
    for row in store.evidence_candidates():
        if now - lease_rules.parse_time(row["balance_at"]) < EVIDENCE_AFTER:
            continue
        if not store.claim_reminder(f"evidence:{row['id']}", "evidence", row["id"]):
            continue
        text = (f"The balance of {row['id']} has existed since {row['balance_at']} but its "
                "evidence is not verified: copy it to a place you control and verify it "
                "(`preflight verify`).")
        message = Message(row["id"], key="alert-evidence", summary=text, blocks=(
            Heading("Evidence not secured"), Text(text, style="warn")))
        _publish(service, message)
        sent.append(message)
    return sent


def _publish(service: PilotService, message: Message) -> None:
    try:
        service.notifier.publish(message)
    except Exception:  # recorded as sent: a transport failure is logged, not retried forever
        log.exception("publishing %s of %s failed", message.key, message.run_id)


def _iso(moment: datetime) -> str:
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")


# -- the scheduler -------------------------------------------------------------------
class BotScheduler:
    """A BackgroundScheduler on the SQLite job store, with the three jobs registered."""

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
                self.scheduler.add_job(job.func, "interval", seconds=job.seconds, id=job.id,
                                       replace_existing=True, coalesce=True,
                                       misfire_grace_time=None, max_instances=1)
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
