"""Starting a run: its node's lease, the start's states, the dispatch handed the run's
launch plan, each step of the start recorded and shown (and the place a stop ends it), the
forecast made again once every volume node is proven (its widened time limit handed back
to the dispatch as the step's answer), and what a start left stopped when the run was
stopped meanwhile. ``PilotService`` holds one (``Starter``)."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import Any

from bot.dispatch.base import Decision, Dispatcher, Progress
from bot.errors import DispatchError, DispatchStopped, LeaseError, PreflightError
from bot.messages.dispatch_view import dispatch_message
from bot.messages.forecast_view import proven_message
from bot.pilot.clock import now_utc
from bot.pilot.states import RESUMABLE, S
from bot.service.handles import dispatcher_for, handle_for, launch_plan
from bot.service.proven import ProvenForecast, corpus_listed
from bot.service.publisher import Publisher
from bot.service.run_checks import check_spec_paths
from bot.store import Run, Store
from runner.events import DISPATCH_NODE

log = logging.getLogger(__name__)

DISPATCH_BEAT_S = 30  # the heartbeat of a start in progress (within follower.DISPATCH_GRACE_S)


class DispatchHeartbeat:
    """While a start runs, note every ``every`` seconds that its bot is still at it
    (``Store.dispatch_beat``): the watch judges a dispatch by its last sign of life."""

    def __init__(self, store: Any, run_id: str, every: float = DISPATCH_BEAT_S) -> None:
        self._store, self._run_id, self._every = store, run_id, every
        self._done = threading.Event()
        store.dispatch_beat(run_id)
        self._thread = threading.Thread(target=self._beat, name=f"dispatch-beat-{run_id}",
                                        daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._done.wait(self._every):
            try:
                self._store.dispatch_beat(self._run_id)
            except PreflightError as exc:  # a busy database: the next beat tries again
                log.warning("run %s: dispatch heartbeat not recorded: %s", self._run_id, exc)

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=5)


# What an answer of a node of the wrong shape raises where no check caught it: the start
# is recorded as failed with it, never left `dispatching` (issue 32).
MALFORMED = (ValueError, TypeError, KeyError, AttributeError, IndexError)
# What a dispatch asks of the run's node's lease: LeaseError when it may not start.
LeaseGuard = Callable[[Run], None]


class Starter:
    """Starts runs, over the store, the dispatchers by node kind and the publisher."""

    def __init__(self, store: Store, dispatchers: Mapping[str, Dispatcher],
                 publisher: Publisher, proven: ProvenForecast, *,
                 lease_guard: LeaseGuard | None = None) -> None:
        self.store = store
        self.dispatchers = dispatchers  # the service's mapping (shared, never copied)
        self.publisher = publisher
        self.proven = proven  # the volume's forecast on its proven nodes
        self.lease_guard = lease_guard

    def start(self, run_id: str, *, resume: bool = False) -> None:
        """Start the run (``resume``: again, from its ledger): its lease first, then
        ``dispatching`` until the runner's pid is known, its steps recorded and shown."""
        run = self.store.run(run_id)
        if self.lease_guard is not None:
            try:
                self.lease_guard(run)
            except LeaseError as exc:
                self._lease_refused(run, exc)
                raise
        dispatcher = dispatcher_for(self.dispatchers, run)
        handle = replace(handle_for(run, resume=resume), progress=self._dispatch_step(run_id),
                         plan=launch_plan(run))
        # "dispatching" until the runner's pid is known: the watch and `preflight runs` only
        # look at "running" runs, so nobody takes a runner being started for a dead one.
        from_states = RESUMABLE if resume else {S.PLANNED}
        # A resumed run is judged on what the new runner reports: the earlier attempt's
        # run.finished, balance and first error no longer count (its events stay recorded).
        fresh = {"resume_seq": run.last_seq, "first_error": None, "outcome": None,
                 "verdict": None, "stop": None} if resume else {"first_error": None}
        if not self.store.transition(run_id, from_states, S.DISPATCHING,
                                     started_at=now_utc(), finished_at=None, **fresh):
            current = self.store.run_record(run_id).status
            if current == S.DISPATCHING:  # another start or resume won the race
                raise DispatchError(f"run {run_id} is being started by another start or "
                                    "resume: it is not started twice; follow it, or "
                                    f"`preflight stop {run_id}` once it runs")
            raise DispatchError(f"run {run_id} is {current}: it cannot be started again; "
                                "submit the manifest again for a new attempt")
        heartbeat = DispatchHeartbeat(self.store, run_id)  # the watch's sign of life
        try:
            check_spec_paths(run)  # its paths, against its record (a resume above all)
            pid = dispatcher.start(handle)
        except DispatchStopped:
            raise  # recorded `stopped` by the stop; what had started is stopped
        except (PreflightError, *MALFORMED) as exc:  # a node's odd answer too: recorded
            if self.store.transition(run_id, (S.DISPATCHING,), S.DISPATCH_FAILED,
                                     first_error={"stage": "dispatch",
                                                  "type": type(exc).__name__,
                                                  "message": str(exc)}):
                self.publisher.publish_outcome(run_id)
            raise
        finally:
            heartbeat.stop()
        if not self.store.transition(run_id, (S.DISPATCHING,), S.RUNNING, pid=pid):
            # Stopped (or settled by the watch) while it started: nobody would follow the
            # runner just launched, so it is stopped too.
            self.stop_quietly(run_id, replace(handle, pid=pid))
            raise DispatchStopped(f"run {run_id} is {self.store.run_record(run_id).status}: "
                                  "it was stopped while it was being started; the runner "
                                  "it launched is stopped")
        self.publisher.publish_status(run_id)

    def _lease_refused(self, run: Run, exc: LeaseError) -> None:
        """A run its node's lease keeps from starting stays ``planned`` (`preflight resume`
        starts it once provisioned), with the refusal as its first error: it shows as
        "refused (lease)" with why, not as a run planned and forgotten."""
        if run.status != S.PLANNED:
            return
        self.store.update_run(run.id, first_error={
            "stage": "lease", "type": "LeaseError", "message": str(exc),
            "hint": f"`preflight resume {run.id}` starts it once the lease is provisioned"})
        self.publisher.publish_status(run.id)

    def _dispatch_step(self, run_id: str) -> Progress:
        """The dispatch's report of a step: recorded (a sign of life), shown in the thread,
        and the place a stop ends a start (DispatchStopped)."""
        def step(data: dict[str, Any]) -> Decision | None:
            self.store.record_dispatch_event(run_id, DISPATCH_NODE, data)
            decision = None
            if data.get("phase") == "proved":  # the forecast again, on the proven nodes
                decision = self._node_proved(run_id)
            elif data.get("phase") == "listed":  # a corpus only the nodes hold: its ids
                corpus_listed(self.store, run_id)
            run = self.store.run(run_id)
            message = dispatch_message(run, self.store.dispatch_events(
                run_id, since=run.started_at))
            if message is not None:
                self.publisher.publish(message)
            if run.status != S.DISPATCHING:
                raise DispatchStopped(f"run {run_id} was stopped while it was being started; "
                                      "what was started on its nodes is stopped")
            return decision
        return step

    def _node_proved(self, run_id: str) -> Decision | None:
        """Once every node is proven: the forecast on their healthy cards, stored, and told
        in the thread when it differs (never a reason to fail the start); the driver's
        time limit it widened, handed back to the start."""
        try:
            new = self.proven.node_proved(run_id)
            message = proven_message(self.store.run(run_id)) if new else None
            if message is not None:
                self.publisher.publish(message)
        except Exception:
            log.exception("run %s: the forecast on its proven nodes failed", run_id)
            return None
        limit = ((new or {}).get("proven") or {}).get("time_limit") or {}
        return Decision(time_limit_s=float(limit["s"])) if limit.get("how") == "widened" \
            else None

    def stop_quietly(self, run_id: str, handle: Any) -> None:
        try:
            dispatcher_for(self.dispatchers, self.store.run_record(run_id)).stop(handle)
        except PreflightError as exc:
            log.warning("run %s: could not stop what its start left: %s", run_id, exc)

