"""The scheduled watch: runs that stall or come back, leases that end, evidence not secured.

``PilotService`` holds a ``Watch`` and hands on ``watch_runs``, ``check_leases`` and
``remind_evidence``; the scheduler (``bot.schedule``) only calls those, with ``now``. Each
alert and reminder is claimed in the store before it is sent, so it goes out once however
late or often a job runs; its words are ``bot.messages.alerts``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from bot.errors import PreflightError
from bot.messages.alerts import (
    evidence_message,
    iso,
    lease_message,
    recovered_message,
    stall_message,
)
from bot.messages.model import Message
from bot.pilot import leases as lease_rules
from bot.pilot.states import S
from bot.service.follower import Follower
from bot.service.publisher import Publisher
from bot.store import RunRecord, Store

log = logging.getLogger(__name__)

EVIDENCE_AFTER = timedelta(minutes=30)
DEFAULT_STALL_S = 600

# PilotService.stop(run_id, by=..., reason=..., wait=False): how a lease's end stops a run.
StopRun = Callable[..., Any]


class Watch:
    """The three scheduled passes, on the service's store, follower and publisher."""

    def __init__(self, store: Store, follower: Follower, publisher: Publisher,
                 stop: StopRun) -> None:
        self.store = store
        self.follower = follower
        self.publisher = publisher
        self.stop = stop

    # -- runs ------------------------------------------------------------------------
    def watch_runs(self, now: datetime) -> list[Message]:
        """One watch pass: pump each active run, alert a stall once, announce a return once."""
        sent: list[Message] = []
        for run in self.store.runs(status=S.DISPATCHING):
            try:  # a start its bot never finished: running if the runner started, else failed
                self.follower.reap(run.id, now=now)
            except PreflightError as exc:
                log.warning("watch of %s: %s", run.id, exc)
        ids = [r.id for r in self.store.running()]
        ids += [w["run"] for w in self.store.stalled_runs() if w["run"] not in ids]
        for run_id in ids:
            try:
                message = self._watch_one(run_id, now)
            except PreflightError as exc:  # one unreachable node must not stop the others
                log.warning("watch of %s: %s", run_id, exc)
                continue
            except Exception:  # nor one run's unexpected failure: logged with its traceback
                log.exception("watch of %s failed", run_id)
                continue
            if message is not None:
                self._send(message)
                sent.append(message)
        return sent

    def _watch_one(self, run_id: str, now: datetime) -> Message | None:
        store = self.store
        if store.run_record(run_id).status == S.RUNNING:
            self.follower.reap(run_id)  # pumps; closes the run if its runner ended unseen
        run = store.run_record(run_id)
        stamp = iso(now)
        first = _first_seen(run, now)
        state = store.observe_run(run_id, run.last_seq, stamp, iso(first))
        quiet = now - lease_rules.parse_time(state["seen_at"])
        if state["stalled"]:
            seen = lease_rules.parse_time(state["seen_at"])
            alerted = lease_rules.parse_time(state["alerted_at"])
            if seen > alerted and store.mark_recovered(run_id, stamp):
                return recovered_message(run, quiet_since=state["alerted_at"])
            return None
        if run.status != S.RUNNING or self.follower.ends.pending(run_id):
            return None  # a runner that finished, its results being fetched, is no stall
        stall_after = timedelta(seconds=_stall_after(run))
        if quiet >= stall_after and store.mark_stalled(run_id, stamp):
            return stall_message(run, stall_after)
        return None

    # -- leases ----------------------------------------------------------------------
    def check_leases(self, now: datetime) -> list[Message]:
        """Post the 24 h / 2 h reminders once each, and end leases at expiry."""
        store = self.store
        sent: list[Message] = []
        for lease in store.leases(include_ended=False):
            for action in lease_rules.due_actions(lease, now):
                host, port = lease_rules.split_key(action.node)
                runs = store.runs_on_node(host, port, since=lease.get("created_at"))
                pending = lease_rules.unsecured(runs)
                if action.kind == "end":
                    if not store.change_lease(action.lease_id, lease["state"],
                                              lease_rules.ENDED, lease_rules.SYSTEM,
                                              note="lease expired"):
                        continue
                    self._stop_runs_on(host, port, action.node)
                if not store.claim_reminder(action.key, f"lease-{action.kind}", action.node,
                                            {"pending": pending, "end": iso(action.end)}):
                    continue
                message = lease_message(action, runs, pending, now)
                self._send(message)
                sent.append(message)
        return sent

    def _stop_runs_on(self, host: str, port: int, node: str) -> None:
        """Nothing of ours keeps running on a node whose lease ended: every run using it (its
        runner, a volume's driver and Ray on every node of the volume) is stopped."""
        for run_id in self.store.running_on_node(host, port):
            try:
                self.stop(run_id, by=lease_rules.SYSTEM, reason=f"the lease of {node} ended",
                          wait=False)
            except PreflightError as exc:  # the next watch still closes what it can
                log.warning("run %s: not stopped at the end of the lease of %s: %s",
                            run_id, node, exc)

    # -- evidence --------------------------------------------------------------------
    def remind_evidence(self, now: datetime) -> list[Message]:
        """One reminder per pilot whose balance is 30 min old and whose evidence is
        unverified."""
        sent: list[Message] = []
        for row in self.store.evidence_candidates():
            if now - lease_rules.parse_time(row["balance_at"]) < EVIDENCE_AFTER:
                continue
            if not self.store.claim_reminder(f"evidence:{row['id']}", "evidence", row["id"]):
                continue
            message = evidence_message(row)
            self._send(message)
            sent.append(message)
        return sent

    def _send(self, message: Message) -> None:
        try:
            self.publisher.notifier.publish(message)
        except Exception:  # recorded as sent: a transport failure is logged, not retried forever
            log.exception("publishing %s of %s failed", message.key, message.run_id)


def _first_seen(run: RunRecord, now: datetime) -> datetime:
    for seen in (run.last_event_at, run.started_at):
        if seen:
            try:
                return min(lease_rules.parse_time(seen), now)
            except ValueError:
                continue
    return now


def _stall_after(run: RunRecord) -> int:
    node = run.node or {}
    try:
        return int(node.get("stall_after_s") or DEFAULT_STALL_S)
    except (TypeError, ValueError):
        return DEFAULT_STALL_S
