"""Following a run: its events recorded then published, a runner that died or a start
that was interrupted settled, and a finished run judged (balance re-checked against the
recorded item events, results fetched once, verdict, forecast, report).

``Follower`` is given the store, the dispatchers and the ``Publisher`` it posts through;
``PilotService`` holds one and hands on ``follow``, ``pump``, ``catch_up`` and ``reap``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime, timezone
from typing import Any

from bot.dispatch.base import Dispatcher, RunHandle
from bot.errors import (
    ContactLost,
    DispatchError,
    NodeUnreachable,
    PreflightError,
)
from bot.messages.volume_view import NOTE_TYPES as VOLUME_NOTES
from bot.messages.volume_view import progress_of
from bot.pilot.balance_check import checked_balance, is_count
from bot.pilot.cards import CARD_STAGES
from bot.pilot.clock import now_utc
from bot.pilot.death import runner_death
from bot.pilot.decisions import end_state
from bot.pilot.fetch_caps import caps_of
from bot.pilot.payloads import Balance, Evidence, StoredForecast
from bot.pilot.states import S
from bot.pilot.verdict import judge
from bot.service.end_lock import end_lock
from bot.service.forecast_inputs import ATTEMPT_EVENTS, check_volume, forecast_for
from bot.service.handles import dispatcher_for, handle_for
from bot.service.publisher import Publisher
from bot.service.report_files import settle_evidence
from bot.service.run_ends import RunEnds
from bot.service.shown_rows import ShownRows
from bot.settings import Settings
from bot.store import Run, RunRecord, Store
from runner.events import (
    BALANCE,
    EVIDENCE,
    PROGRESS,
    RUN_FINISHED,
    STAGE_EVENT_TYPES,
    Event,
)

log = logging.getLogger(__name__)

BACKLOG = 2000  # a follower that read this many events at once reads on without waiting
# A start silent this long was interrupted: no step and no heartbeat (the bot that started
# it stopped). A start that keeps giving signs of life is never cut short, however long.
DISPATCH_GRACE_S = 120
class Follower:
    """Follows, watches and finishes runs; what it learns is recorded, then published."""

    def __init__(self, settings: Settings, store: Store, dispatchers: Mapping[str, Dispatcher],
                 publisher: Publisher) -> None:
        self.settings = settings
        self.store = store
        self.dispatchers = dispatchers  # the service's own mapping: a change there is seen here
        self.publisher = publisher
        self._finish_checked: set[str] = set()
        # a run's end (its results fetched, then judged) runs off this thread
        self.ends = RunEnds()
        # a volume's per-worker rates ride on one progress event in 30 s (runner/volume.py):
        # the latest seen is shown with every progress until the next
        self._per_card: dict[str, Any] = {}

    def _dispatcher(self, run: RunRecord) -> Dispatcher:
        return dispatcher_for(self.dispatchers, run)

    def _handle(self, run: RunRecord) -> RunHandle:
        return handle_for(run)

    def follow(self, run_id: str, *, stop: threading.Event | None = None,
               poll: float = 0.1, timeout: float | None = None) -> dict[str, Any]:
        """Consume the run's events until it finishes (or ``stop`` is set).

        While the node cannot be reached the follower keeps trying (the dispatcher paces the
        reconnects); after ``settings.contact_give_up_s`` without contact it raises
        ``ContactLost``: the runner may still be running, nothing is judged.
        """
        stop = stop or threading.Event()
        deadline = None if timeout is None else time.monotonic() + timeout
        contact = _Contact(run_id, self.settings.contact_give_up_s)
        while not stop.is_set():
            try:
                fresh = self.pump(run_id)
            except NodeUnreachable as exc:
                try:
                    contact.lost(exc)
                except ContactLost:
                    self._head_lost(run_id)
                    raise
                if deadline is not None and time.monotonic() > deadline:
                    raise
                stop.wait(poll)
                continue
            contact.back()
            run = self.store.run_record(run_id)  # every poll: none of the big columns
            if run.status != S.RUNNING:
                self.ends.wait(run_id)  # an end that recorded it: its messages sent too
                return self.store.get_run(run_id)
            if self.ends.pending(run_id):  # its results being fetched: wait for the verdict
                if deadline is not None and time.monotonic() > deadline:
                    raise DispatchError(f"run {run_id} still being ended after {timeout} s")
                self.ends.wait(run_id, poll)
                continue
            if not fresh and not self._dispatcher(run).is_alive(self._handle(run)):
                if not self.pump(run_id):  # the last lines may have landed as it exited
                    self._runner_died(run_id)
                    return self.store.get_run(run_id)
            if deadline is not None and time.monotonic() > deadline:
                raise DispatchError(f"run {run_id} still running after {timeout} s")
            if len(fresh) < BACKLOG:  # a steady stream is read once per poll, in chunks
                stop.wait(poll)
        return self.store.get_run(run_id)

    def _head_lost(self, run_id: str) -> None:
        """The run's node (a volume's head) is out of reach for good: the volume's other
        nodes are stopped, so their Ray and cards are not left working for a driver that
        is gone; Ray on the head is stopped by the next look that reaches it."""
        self._clean_up(self.store.run_record(run_id), "its node is out of reach; ")

    def pump(self, run_id: str) -> list[Event]:
        """Read, record, then publish whatever the runner appended since last time."""
        fresh = self._ingest(run_id)
        stage_changed = any(e.type in STAGE_EVENT_TYPES for e in fresh)
        progress = [e for e in fresh if e.type == PROGRESS]
        if progress:  # only the latest counts: nothing per item here
            cards = [e.data["per_card"] for e in progress if "per_card" in e.data]
            if cards:
                self._per_card[run_id] = cards[-1]
            data = progress[-1].data
            if "per_card" not in data and run_id in self._per_card:
                data = {**data, "per_card": self._per_card[run_id]}
            reported = progress_of(data)
            self.publisher.note_progress(run_id, reported.done, reported.total, reported.pace)
        if any(e.type in VOLUME_NOTES for e in fresh):
            self.publisher.publish_volume(run_id)
        if stage_changed:
            self.publisher.publish_status(run_id)
        if any(e.type in STAGE_EVENT_TYPES and e.stage in CARD_STAGES for e in fresh):
            self.publisher.publish_cards(run_id)
        elif any(e.type == PROGRESS for e in fresh):
            self.publisher.maybe_publish_progress(run_id)
        # run.finished is looked for when it arrives, and once per run in this process (a
        # run whose run.finished was recorded by a bot that stopped before finishing it).
        if (any(e.type == RUN_FINISHED for e in fresh) or run_id not in self._finish_checked) \
                and self._since_resume(run_id, RUN_FINISHED):
            self._finish(run_id)
        self._finish_checked.add(run_id)
        return fresh

    def _ingest(self, run_id: str) -> list[Event]:
        """Read and record (nothing published) what the runner appended since last time."""
        run = self.store.run_record(run_id)
        if run.status != S.RUNNING:
            return []
        handle = self._handle(run)
        events, offset = self._dispatcher(run).read_events(handle, run.events_offset)
        return self.store.record_events(run_id, events, offset) if events else []

    def catch_up(self, run_ids: list[str]) -> list[str]:
        """A restarted bot: record what each runner wrote while nobody followed, then finish
        the runs that ended, in the order their runners finished, so each thread gets its
        outcome once and the threads in finish order. Returns the ids finished."""
        ended: list[tuple[str, str]] = []
        for run_id in run_ids:
            try:
                self._ingest(run_id)
            except PreflightError as exc:  # an unreachable node: its follower will retry
                log.warning("catching up with %s: %s", run_id, exc)
                continue
            finished = self._since_resume(run_id, RUN_FINISHED)
            if finished and self.store.run_record(run_id).status == S.RUNNING:
                ended.append((finished[-1].ts, run_id))
        for _, run_id in sorted(ended):
            self._finish(run_id)
            self.ends.wait(run_id)  # in finish order: each end recorded before the next
        return [run_id for _, run_id in sorted(ended)]

    def reap(self, run_id: str, *, now: datetime | None = None) -> bool:
        """Close a running run whose runner ended while nobody followed it; True if closed.

        A run left ``dispatching`` by a bot that stopped mid-start is settled too, once
        ``DISPATCH_GRACE_S`` have passed since the start's last sign of life (a step of
        its dispatch or its heartbeat): ``running`` if its runner did start, else
        ``dispatch_failed`` (then `preflight resume` starts it again).
        """
        run = self.store.run_record(run_id)
        if run.status == S.DISPATCHING:
            return self._settle_dispatch(run, now or datetime.now(timezone.utc))
        # an end under way (its results being fetched) is not a death
        if run.status != S.RUNNING or self.pump(run_id) or not self.ends.wait(run_id, 0):
            return False
        run = self.store.run_record(run_id)
        if run.status != S.RUNNING or self._dispatcher(run).is_alive(self._handle(run)):
            return False
        self._runner_died(run_id)
        return True

    def _settle_dispatch(self, run: RunRecord, now: datetime) -> bool:
        signs = [run.started_at or run.created_at, self.store.dispatch_alive_at(run.id)]
        last = max(datetime.fromisoformat(s) for s in signs if s)
        if (now - last).total_seconds() < DISPATCH_GRACE_S:
            return False  # still being started, by this bot or another
        dispatcher, handle = self._dispatcher(run), self._handle(run)
        try:
            events, _ = dispatcher.read_events(handle, 0)
            started = bool(events) or dispatcher.is_alive(handle)
        except NodeUnreachable:
            return False  # the node did not answer: nothing is known, decide later
        except PreflightError:
            started = False  # nothing on the node to follow
        if started:
            self.store.transition(run.id, (S.DISPATCHING,), S.RUNNING)
            return False
        self._clean_up(run)
        error = {"stage": "dispatch", "type": "DispatchInterrupted",
                 "message": "the bot stopped while starting the runner, and no runner "
                            "started", "hint": f"`preflight resume {run.id}` starts it"}
        if not self.store.transition(run.id, (S.DISPATCHING,), S.DISPATCH_FAILED,
                                     first_error=error):
            return False
        self.publisher.publish_outcome(run.id)
        return True

    def _finish(self, run_id: str) -> None:
        """The run's end, on a worker thread (``RunEnds``): fetching its results can take
        minutes, and the follower goes on with this run's events and the others'."""
        self.ends.start(run_id, self._end)

    def _end(self, run_id: str) -> None:
        # A Slack follower and the watch job may both see run.finished, and so may another
        # bot process (a `preflight stop` following the run it stopped): one finishes it
        # (stopping Ray and fetching results once); the others wait, then find it ended.
        run = self.store.run_record(run_id)
        with end_lock(run.run_dir, run_id, "fetching its results"), \
                self.publisher.run_lock(run_id):
            if self.store.run_record(run_id).status == S.RUNNING:
                self._finish_locked(run_id)

    def _finish_locked(self, run_id: str) -> None:
        record = self.store.run(run_id)  # read once, carried through the end
        finished = self._since_resume(run_id, RUN_FINISHED, record)[-1]
        balance = self._recorded(record, BALANCE)
        evidence = self._recorded(record, EVIDENCE)
        if evidence is not None:  # a node's word: a forged field is named, never stored
            evidence = Evidence.from_event(evidence)
        if balance is not None:  # typed first: a forged one is flagged, never drawn
            balance = self._recheck_balance(record, checked_balance(balance) or {})
        handle = self._handle(record)
        try:
            # the copy the team controls, verified here; the bot decides where evidence
            # lives, the node's "dest" is only a claim (report_files.settle_evidence)
            evidence = settle_evidence(record, evidence,
                                       self._dispatcher(record).fetch_results(handle))
        except PreflightError as exc:
            # The copy the team controls is what counts: a fetch that fails, or a fetched
            # copy that does not verify, overrides the node's own "verified".
            log.warning("could not fetch results of %s: %s", run_id, exc)
            evidence = {**(settle_evidence(record, evidence, None) or {}), "verified": False,
                        "fetch_error": str(exc)}
        record = replace(  # typed as the store will read them back (bot.pilot.payloads)
            record, balance=Balance.from_stored(run_id, balance) if balance else None,
            evidence=Evidence.from_stored(run_id, evidence) if evidence else None)
        stages = self.store.stages(run_id)
        environment = {s["stage"]: s["facts"] for s in stages if s.get("facts")}
        verdict = judge(record, stages, finished.data)
        outcome = "passed" if verdict["passed"] else "failed"
        if self.store.transition(run_id, (S.RUNNING,), end_state(record), outcome=outcome,
                                 verdict=verdict, balance=balance, evidence=evidence,
                                 environment=environment, forecast=self._forecast(record, stages),
                                 finished_at=now_utc(), exit_code=finished.data.get("exit_code")):
            self.publisher.publish_outcome(run_id)
            self.publisher.forget(run_id)
            self._per_card.pop(run_id, None)

    def _forecast(self, run: Run, stages: list[dict[str, Any]]) -> dict[str, Any] | None:
        """A pilot's forecast of its volume; a volume's actual time against that forecast."""
        try:
            if run.kind == "volume":
                parent = self.store.run(run.parent_run) if run.parent_run else None
                events = sorted((e for etype in ATTEMPT_EVENTS
                                 for e in self.store.events_of_type(run.id, etype)),
                                key=lambda e: e.seq)
                done = next((e.data.get("done") for e in reversed(events)
                             if e.type == "progress" and isinstance(e.data.get("done"), int)),
                            None)
                # scored on the forecast for the cards really used, once the nodes proved
                # them (bot/service/proven.py); else on the approved one
                own = run.forecast
                basis = own if own is not None and own.proven and not own.is_check else \
                    (parent.forecast if parent else None)
                return check_volume(run, stages, basis.as_dict() if basis else None,
                                    events, done)
            if run.manifest is None or run.manifest.volume is None:
                return None  # nothing to forecast: the item outcomes are not even read
            started = self.store.events_of_type(run.id, "run.started")
            return forecast_for(run, stages, self.store.item_outcomes(run.id),
                                runner_started=started[-1].ts if started else None,
                                caps=caps_of(self.settings))
        except Exception:  # a forecast must never cost the run its verdict
            log.exception("forecast of run %s failed", run.id)
            return None

    def refresh_forecast(self, run_id: str, run: Run | None = None) -> StoredForecast | None:
        """The pilot's forecast again, from now (an approval may come days after the
        pilot): stored when it changed; a volume run's check is left as it is. ``run``: the
        run as the caller's step read it (else read here)."""
        run = run if run is not None else self.store.run(run_id)
        old = run.forecast
        if run.kind != "pilot" or run.status != "awaiting_decision" or old is None:
            return old
        new = self._forecast(run, self.store.stages(run_id))
        if new is not None and new != old.values:
            self.store.update_run(run_id, forecast=new)
            return StoredForecast.from_stored(run_id, new)
        return old

    def _clean_up(self, run: RunRecord, why: str = "") -> None:
        """The runner ended with nothing fetched (or its node is out of reach): what its
        start brought up beside it (a volume's Ray) is stopped where it answers; a problem
        is logged and left to the next look."""
        try:
            problems = self._dispatcher(run).clean_up(self._handle(run))
        except PreflightError as exc:
            problems = [str(exc)]
        if problems:
            log.warning("run %s: %sRay not stopped on every node: %s", run.id, why,
                        "; ".join(problems))

    def _runner_died(self, run_id: str) -> None:
        record = self.store.run(run_id)
        self._clean_up(record)
        handle, dispatcher = self._handle(record), self._dispatcher(record)
        code = dispatcher.exit_code(handle)
        events = self.store.events(run_id, after_seq=max(0, record.last_seq - 1))
        error = runner_death(record.stage_reached, code, events[-1] if events else None,
                             dispatcher.log_tail(handle))
        self.store.interrupt_stages(run_id)  # the stage that ran did not pass or fail
        verdict = {"passed": False, "checks": [{"ok": False, "text": error["message"]}]}
        if self.store.transition(run_id, (S.RUNNING,), end_state(record), outcome="failed",
                                 first_error=record.first_error or error, verdict=verdict,
                                 finished_at=now_utc(), exit_code=code):
            self.publisher.publish_outcome(run_id)

    def _recheck_balance(self, run: Run, balance: dict[str, Any]) -> dict[str, Any]:
        """Apply the balance rules again to the item events the bot itself recorded."""
        from runner.balance import compute_balance

        shown = ShownRows()  # the items are streamed: a million are never held at once
        ours = compute_balance(self.store.iter_expected_ids(run.id),
                               list(run.expected_refusals), list(run.categories),
                               shown.seen(self.store.iter_items(run.id)),
                               keep_rows=False).to_dict()
        # The run's row keeps the rows a message shows, not one per item: it is read back
        # at every look at the run (100,000 rows would be decoded each time); every row is
        # in the items table and in the run's balance.csv.
        merged = {**balance, "items_total": shown.count,
                  "items": [{k: i[k] for k in ("id", "status", "category", "reason")}
                            for i in shown.rows()]}
        disagreements = [k for k in ("accepted", "refused", "total")
                         if ours.get(k) != balance.get(k)]
        if _forgotten_explain(balance, ours):  # inputs of lost outputs, not run again yet
            disagreements = []
        # The runner sees more than the events show (ids a handler invented or returned
        # twice stay in its ledger): only its claiming "ok" against the events is a lie.
        if balance.get("ok") and not ours.get("ok"):
            disagreements.append("ok")
        if disagreements:
            merged["ok"] = False
            merged["problems"] = list(balance.get("problems") or []) + [
                {"kind": "recheck", "id": "", "detail":
                 f"the runner's balance and the recorded item events disagree on "
                 f"{', '.join(disagreements)} (runner: {[balance.get(k) for k in disagreements]}, "
                 f"recorded: {[ours.get(k) for k in disagreements]})"}]
        merged["recheck"] = {k: ours.get(k) for k in ("accepted", "refused", "total", "ok")}
        return merged

    def _recorded(self, run: RunRecord, etype: str) -> dict[str, Any] | None:
        events = self._since_resume(run.id, etype, run)
        return dict(events[-1].data) if events else None

    def _since_resume(self, run_id: str, etype: str,
                      run: RunRecord | None = None) -> list[Event]:
        """Events of a type written by the current runner (after the last resume);
        ``run``: the run as the caller read it (else its record is read here)."""
        after = (run if run is not None else self.store.run_record(run_id)).resume_seq
        return self.store.events_of_type(run_id, etype, after_seq=after)


def _forgotten_explain(balance: dict[str, Any], ours: dict[str, Any]) -> bool:
    """Whether the runner's balance, already not ok, differs from the bot's recount by
    exactly its ``forgotten_pending`` inputs (accepted in the item events, forgotten by
    the ledger when their outputs were lost with their node: runner/volume_lost.py), and
    in nothing else: then the counts differ for that reason, not because the node lied.
    ``balance`` is as ``checked_balance`` gives it: its counts and ``forgotten_pending``
    type-checked, or a flagged one without them."""
    pending = balance.get("forgotten_pending")
    if balance.get("ok") is not False or not is_count(pending) or not pending:
        return False
    return ours.get("accepted") == balance.get("accepted", 0) + pending \
        and ours.get("refused") == balance.get("refused") \
        and ours.get("total") == balance.get("total")


class _Contact:
    """How long a follower has been without contact with a run's node."""

    def __init__(self, run_id: str, give_up_s: float) -> None:
        self.run_id, self.give_up_s = run_id, give_up_s
        self.since: float | None = None

    def lost(self, exc: NodeUnreachable) -> None:
        now = time.monotonic()
        self.since = self.since if self.since is not None else now
        if now - self.since >= self.give_up_s:
            raise ContactLost(self.run_id, now - self.since, str(exc)) from exc

    def back(self) -> None:
        self.since = None
