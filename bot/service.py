"""PilotService: the one orchestrator. submit → plan → dispatch → follow → decide.

It knows no Slack and no SQL: it is given a store, dispatchers (by node kind) and a
notifier, and every transport (console, Slack) calls it. Every event is recorded in the
store before any message is published, and the follower's position is stored with it, so
a restarted bot continues from the last consumed ``seq`` without losing or repeating posts.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot.dispatch.base import Dispatcher, RunHandle
from bot.errors import (
    ContactLost,
    DecisionRefused,
    DispatchError,
    NodeUnreachable,
    PolicyRefused,
    PreflightError,
)
from bot.guard import PolicyGuard
from bot.manifest.load import LoadedManifest, load_manifest
from bot.manifest.project_check import git_commit
from bot.messages import views
from bot.messages.cards import cards_message
from bot.messages.forecast_view import forecast_message
from bot.messages.model import Attachment, Message, Notifier
from bot.messages.progress import ProgressMeter
from bot.messages.volume_view import NOTE_TYPES as VOLUME_NOTES
from bot.messages.volume_view import progress_of, volume_message
from bot.pilot.cards import CARD_STAGES
from bot.pilot.death import runner_death
from bot.pilot.decisions import end_state
from bot.pilot.plan import make_plan
from bot.pilot.specbuild import build_spec, runs_dir_for
from bot.pilot.states import ENDED, RESUMABLE, S
from bot.pilot.verdict import judge
from bot.pilot.volume_nodes import volume_node
from bot.policy import Policy, default_policy
from bot.policy.model import Origin
from bot.records import Records
from bot.reporting import ReportFiles
from bot.settings import Settings
from bot.store import Store
from runner.events import (
    BALANCE,
    EVIDENCE,
    ITEM_DONE,
    PROGRESS,
    RUN_FINISHED,
    STAGE_EVENT_TYPES,
    Event,
)

log = logging.getLogger(__name__)

BACKLOG = 2000  # a follower that read this many events at once reads on without waiting
DISPATCH_GRACE_S = 120  # a start that takes longer than this was interrupted
LeaseGuard = Callable[[dict[str, Any]], None]
# The manifest and project checks that stop a pilot before it is planned (ProjectCheckError).
Precheck = Callable[[LoadedManifest], object]


@dataclass(frozen=True)
class Submission:
    run_id: str
    run_dir: Path
    loaded: LoadedManifest


class PilotService(Records):
    def __init__(self, settings: Settings, store: Store, dispatchers: Mapping[str, Dispatcher],
                 notifier: Notifier, *, lease_guard: LeaseGuard | None = None,
                 precheck: Precheck | None = None, progress_interval: float = 0.2,
                 policy: Policy | None = None) -> None:
        self.settings = settings
        self.store = store
        self.guard = PolicyGuard(policy or default_policy(settings.home, settings.policy_path,
                                                          settings.approvers), store)
        self.dispatchers = dict(dispatchers)
        self.notifier = notifier
        self.lease_guard = lease_guard
        self.precheck = precheck
        self.progress_interval = progress_interval
        self._progress: dict[str, ProgressMeter] = {}
        self._status_base: dict[str, tuple[dict[str, Any], list[dict[str, Any]]]] = {}
        self._finish_checked: set[str] = set()
        self._last_progress_post: dict[str, float] = {}
        self._lock = threading.Lock()
        self._run_locks: dict[str, threading.Lock] = {}

    # -- submit -------------------------------------------------------------------
    def submit_text(self, text: str, *, source: str, base_dir: Path, submitter: str,
                    channel: str | None = None, thread_ts: str | None = None,
                    origin: Origin = "cli") -> Submission:
        loaded = self.load(text, source=source, base_dir=base_dir, user=submitter, origin=origin)
        return self.submit(loaded, submitter=submitter, channel=channel, thread_ts=thread_ts,
                           origin=origin)

    def load(self, text: str, *, source: str, base_dir: Path, user: str,
             origin: Origin) -> LoadedManifest:
        """Load manifest text, refused by the policy (PolicyRefused) before any path it
        names is looked at."""
        self.guard.screen(text, source=source, base_dir=base_dir, user=user, origin=origin)
        loaded = load_manifest(text, source=source, base_dir=base_dir)
        self.guard.check_files(loaded, user=user, origin=origin)
        return loaded

    def submit(self, loaded: LoadedManifest, *, submitter: str, channel: str | None = None,
               thread_ts: str | None = None, kind: str = "pilot", parent: str | None = None,
               inputs: Any | None = None, origin: Origin = "cli") -> Submission:
        """Plan an attempt and prepare its own new run directory; nothing is started yet.

        The policy is checked here whoever calls (PolicyRefused, recorded, nothing created).
        """
        from bot.pilot.prechecks import expected_inputs, previous_changes

        approvers, two_person = self.guard.admit(loaded, user=submitter, origin=origin,
                                                 inputs=inputs)
        if self.precheck is not None and kind == "pilot":  # a volume was checked as its pilot
            self.precheck(loaded)
        m = loaded.manifest
        plan = make_plan(loaded)
        ids = expected_inputs(loaded, inputs)
        with self._lock:
            attempt = self.store.next_attempt(m.name, kind)
            run_id = new_run_id(m.name, attempt, kind)
            run_dir = runs_dir_for(loaded, self.settings.runs_dir) / run_id
            try:
                run_dir.parent.mkdir(parents=True, exist_ok=True)
                run_dir.mkdir(exist_ok=False)  # a run directory is never reused
            except FileExistsError as exc:
                raise DispatchError(f"run directory {run_dir} already exists: "
                                    "refusing to reuse it") from exc
            except OSError as exc:
                raise DispatchError(f"cannot create run directory {run_dir}: {exc}") from exc
            spec = build_spec(loaded, plan, run_id, inputs=inputs, kind=kind)
            spec = replace(spec, project=replace(  # what exactly ran: its git commit
                spec.project, commit=git_commit(Path(loaded.project_dir))))
            (run_dir / "manifest.yaml").write_text(loaded.text, encoding="utf-8")
            spec_path = run_dir / "spec.json"
            spec_path.write_text(spec.to_json(), encoding="utf-8")
            manifest_json = m.model_dump(mode="json")
            self._create_run(run_dir, {
                "id": run_id, "name": m.name, "attempt": attempt, "kind": kind,
                "parent_run": parent, "plan": plan.to_dict(),
                "changes": previous_changes(self.store.previous_attempt(m.name, run_id),
                                            manifest_json)
                if kind == "pilot" else [],
                "manifest_text": loaded.text, "manifest_json": manifest_json,
                "spec_path": str(spec_path), "run_dir": str(run_dir),
                "base_dir": str(loaded.base_dir), "project_dir": str(loaded.project_dir),
                "node": (volume_node(m) if kind == "volume" else m.node).model_dump(
                    mode="json"), "submitter": submitter,
                "channel": channel, "thread_ts": thread_ts, "expected_ids": ids,
                "expected_refusals": list(spec.inputs.expected_refusals),
                # The runner's rule: a training task without categories accepts "train".
                "categories": list(spec.task.categories)
                or (["train"] if spec.task.kind == "train" else []),
                "success": spec.success.__dict__ | {"copy_to": spec.results.copy_to},
                "approvers": approvers, "two_person": int(two_person),
            })
        if kind == "pilot":
            self._publish(views.plan_message(self.store.get_run(run_id)))
        return Submission(run_id, run_dir, loaded)

    def _create_run(self, run_dir: Path, record: dict[str, Any]) -> None:
        try:
            self.store.create_run(record)
        except PreflightError:
            shutil.rmtree(run_dir, ignore_errors=True)  # nothing recorded: leave no trace
            raise

    # -- dispatch -----------------------------------------------------------------
    def start(self, run_id: str, *, resume: bool = False) -> None:
        run = self.store.get_run(run_id)
        if self.lease_guard is not None:
            self.lease_guard(run)
        dispatcher = self._dispatcher(run)
        handle = self._handle(run, resume=resume)
        # "dispatching" until the runner's pid is known: the watch and `preflight runs` only
        # look at "running" runs, so nobody takes a runner being started for a dead one.
        from_states = RESUMABLE if resume else {S.PLANNED}
        # A resumed run is judged on what the new runner reports: the earlier attempt's
        # run.finished, balance and first error no longer count (its events stay recorded).
        fresh = {"resume_seq": int(run["last_seq"]), "first_error": None, "outcome": None,
                 "verdict": None, "stop": None} if resume else {}
        if not self.store.transition(run_id, from_states, S.DISPATCHING,
                                     started_at=_now(), finished_at=None, **fresh):
            raise DispatchError(f"run {run_id} is {run['status']}: it cannot be started again; "
                                "submit the manifest again for a new attempt")
        try:
            pid = dispatcher.start(handle)
        except PreflightError as exc:
            self.store.transition(run_id, (S.DISPATCHING,), S.DISPATCH_FAILED,
                                  first_error={"stage": "dispatch", "type": type(exc).__name__,
                                               "message": str(exc)})
            self._publish_outcome(run_id)
            raise
        self.store.transition(run_id, (S.DISPATCHING,), S.RUNNING, pid=pid)
        self._publish_status(run_id)

    def resume(self, run_id: str) -> None:
        """Start a stopped run again from its ledger, or a run never started (a dispatch
        refused because the node's lease was not provisioned yet) for the first time."""
        run = self.store.get_run(run_id)
        if run["status"] == S.PLANNED:
            self.start(run_id)
            return
        if run["status"] == S.DISPATCHING:
            self.reap(run_id)  # settles a start interrupted more than DISPATCH_GRACE_S ago
            run = self.store.get_run(run_id)
            if run["status"] == S.DISPATCHING:
                raise DispatchError(f"run {run_id} is being started; if the bot that started "
                                    f"it stopped, try again in {DISPATCH_GRACE_S} s")
        if run["status"] == S.DECIDED:
            raise DispatchError(f"run {run_id} is decided; submit the manifest again instead")
        if run["status"] == S.RUNNING and self._dispatcher(run).is_alive(self._handle(run)):
            raise DispatchError(f"run {run_id} is still running; nothing to resume")
        self.start(run_id, resume=True)

    def stop(self, run_id: str, *, by: str, reason: str, timeout: float = 60,
             wait: bool = True) -> dict[str, Any]:
        """Stop a running run: its runner and everything it started, recorded as ``stopped``
        with who and why. The ledger keeps the finished items; `resume` continues.

        ``wait``: follow the run until it is closed (a transport that already follows it,
        like Slack's followers, passes False).
        """
        run = self.store.find_run(run_id)
        reason = (reason or "").strip()
        if not reason:
            raise DecisionRefused("a reason is required to stop a run")
        stop = {"by": by, "reason": reason, "at": _now()}
        if not self.store.transition(run["id"], (S.RUNNING,), S.RUNNING, stop=stop):
            current = self.store.get_run(run["id"])["status"]
            raise DispatchError(f"run {run['id']} is {current}: only a running run can be "
                                "stopped" + (" (it is starting; try again in a moment)"
                                             if current == S.DISPATCHING else ""))
        self._dispatcher(run).stop(self._handle(self.store.get_run(run["id"])))
        return self.follow(run["id"], timeout=timeout) if wait else self.store.get_run(run["id"])

    # -- follow -------------------------------------------------------------------
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
                contact.lost(exc)
                if deadline is not None and time.monotonic() > deadline:
                    raise
                stop.wait(poll)
                continue
            contact.back()
            run = self.store.run_head(run_id)  # every poll: no decoding of the big columns
            if run["status"] != S.RUNNING:
                return self.store.get_run(run_id)
            if not fresh and not self._dispatcher(run).is_alive(self._handle(run)):
                if not self.pump(run_id):  # the last lines may have landed as it exited
                    self._runner_died(run_id)
                    return self.store.get_run(run_id)
            if deadline is not None and time.monotonic() > deadline:
                raise DispatchError(f"run {run_id} still running after {timeout} s")
            if len(fresh) < BACKLOG:  # a steady stream is read once per poll, in chunks
                stop.wait(poll)
        return self.store.get_run(run_id)

    def pump(self, run_id: str) -> list[Event]:
        """Read, record, then publish whatever the runner appended since last time."""
        fresh = self._ingest(run_id)
        stage_changed = any(e.type in STAGE_EVENT_TYPES for e in fresh)
        progress = [e for e in fresh if e.type == PROGRESS]
        if progress:  # only the latest counts: nothing per item here
            meter = self._progress.setdefault(run_id, ProgressMeter())
            reported = progress_of(progress[-1].data)
            meter.update(reported.done, reported.total, time.monotonic(), reported.pace)
        if any(e.type in VOLUME_NOTES for e in fresh):
            self._publish_volume(run_id)
        if stage_changed:
            self._publish_status(run_id)
        if any(e.type in STAGE_EVENT_TYPES and e.stage in CARD_STAGES for e in fresh):
            self._publish_cards(run_id)
        elif any(e.type == PROGRESS for e in fresh):
            self._maybe_publish_progress(run_id)
        # run.finished is looked for when it arrives, and once per run in this process (a
        # run whose run.finished was recorded by a bot that stopped before finishing it).
        if (any(e.type == RUN_FINISHED for e in fresh) or run_id not in self._finish_checked) \
                and self._since_resume(run_id, RUN_FINISHED):
            self._finish(run_id)
        self._finish_checked.add(run_id)
        return fresh

    def _ingest(self, run_id: str) -> list[Event]:
        """Read and record (nothing published) what the runner appended since last time."""
        run = self.store.run_head(run_id)
        if run["status"] != S.RUNNING:
            return []
        handle = self._handle(run)
        events, offset = self._dispatcher(run).read_events(handle, int(run["events_offset"]))
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
            if finished and self.store.get_run(run_id)["status"] == S.RUNNING:
                ended.append((finished[-1].ts, run_id))
        for _, run_id in sorted(ended):
            self._finish(run_id)
        return [run_id for _, run_id in sorted(ended)]

    def reap(self, run_id: str, *, now: datetime | None = None) -> bool:
        """Close a running run whose runner ended while nobody followed it; True if closed.

        A run left ``dispatching`` by a bot that stopped mid-start is settled too, once
        ``DISPATCH_GRACE_S`` have passed: ``running`` if its runner did start, else
        ``dispatch_failed`` (then `preflight resume` starts it again).
        """
        run = self.store.get_run(run_id)
        if run["status"] == S.DISPATCHING:
            return self._settle_dispatch(run, now or datetime.now(timezone.utc))
        if run["status"] != S.RUNNING or self.pump(run_id):
            return False
        run = self.store.get_run(run_id)
        if run["status"] != S.RUNNING or self._dispatcher(run).is_alive(self._handle(run)):
            return False
        self._runner_died(run_id)
        return True

    def _settle_dispatch(self, run: dict[str, Any], now: datetime) -> bool:
        started_at = datetime.fromisoformat(run.get("started_at") or run["created_at"])
        if (now - started_at).total_seconds() < DISPATCH_GRACE_S:
            return False  # maybe still being started, by this bot or another
        dispatcher, handle = self._dispatcher(run), self._handle(run)
        try:
            events, _ = dispatcher.read_events(handle, 0)
            started = bool(events) or dispatcher.is_alive(handle)
        except NodeUnreachable:
            return False  # the node did not answer: nothing is known, decide later
        except PreflightError:
            started = False  # nothing on the node to follow
        if started:
            self.store.transition(run["id"], (S.DISPATCHING,), S.RUNNING)
            return False
        error = {"stage": "dispatch", "type": "DispatchInterrupted",
                 "message": "the bot stopped while starting the runner, and no runner "
                            "started", "hint": f"`preflight resume {run['id']}` starts it"}
        if not self.store.transition(run["id"], (S.DISPATCHING,), S.DISPATCH_FAILED,
                                     first_error=error):
            return False
        self._publish_outcome(run["id"])
        return True

    def _finish(self, run_id: str) -> None:
        # A Slack follower and the watch job may both see run.finished: one finishes it
        # (fetching results once); the other finds it no longer running.
        with self._run_lock(run_id):
            if self.store.get_run(run_id)["status"] == S.RUNNING:
                self._finish_locked(run_id)

    def _run_lock(self, run_id: str) -> threading.Lock:
        with self._lock:
            return self._run_locks.setdefault(run_id, threading.Lock())

    def _finish_locked(self, run_id: str) -> None:
        run = self.store.get_run(run_id)
        finished = self._since_resume(run_id, RUN_FINISHED)[-1]
        balance = self._recorded(run_id, BALANCE)
        evidence = self._recorded(run_id, EVIDENCE)
        if balance is not None:
            balance = self._recheck_balance(run, balance)
        handle = self._handle(run)
        try:
            local = self._dispatcher(run).fetch_results(handle)
            if local is not None and evidence:  # the copy the team controls, verified here
                evidence = {**evidence, "dest": str(local), "node_dest": evidence.get("dest")}
        except PreflightError as exc:
            # The copy the team controls is what counts: a fetch that fails, or a fetched
            # copy that does not verify, overrides the node's own "verified".
            log.warning("could not fetch results of %s: %s", run_id, exc)
            evidence = {**(evidence or {}), "verified": False, "fetch_error": str(exc)}
        run = {**run, "balance": balance, "evidence": evidence}
        stages = self.store.stages(run_id)
        environment = {s["stage"]: s["facts"] for s in stages if s.get("facts")}
        verdict = judge(run, stages, finished.data)
        outcome = "passed" if verdict["passed"] else "failed"
        if self.store.transition(run_id, (S.RUNNING,), end_state(run), outcome=outcome,
                                 verdict=verdict, balance=balance, evidence=evidence,
                                 environment=environment, forecast=self._forecast(run, stages),
                                 finished_at=_now(), exit_code=finished.data.get("exit_code")):
            self._publish_outcome(run_id)
            self._progress.pop(run_id, None)
            self._status_base.pop(run_id, None)

    def _forecast(self, run: dict[str, Any], stages: list[dict[str, Any]]
                  ) -> dict[str, Any] | None:
        """A pilot's forecast of its volume; a volume's actual time against that forecast."""
        from bot.forecasting import check_volume, forecast_for

        try:
            if run.get("kind") == "volume":
                parent = self.store.get_run(run["parent_run"]) if run.get("parent_run") else {}
                return check_volume(run, stages, parent.get("forecast"))
            return forecast_for(run, stages, self.store.events_of_type(run["id"], ITEM_DONE))
        except Exception:  # a forecast must never cost the run its verdict
            log.exception("forecast of run %s failed", run["id"])
            return None

    def refresh_forecast(self, run_id: str) -> dict[str, Any] | None:
        """The pilot's forecast again, from now (an approval may come days after the
        pilot): stored when it changed; a volume run's check is left as it is."""
        run = self.store.get_run(run_id)
        old: dict[str, Any] | None = run.get("forecast")
        if run.get("kind", "pilot") != "pilot" or run["status"] != "awaiting_decision" \
                or not old:
            return old
        new = self._forecast(run, self.store.stages(run_id))
        if new is not None and new != old:
            self.store.update_run(run_id, forecast=new)
            return new
        return old

    def write_report(self, run_id: str, *, strict: bool = False) -> ReportFiles | None:
        """(Re)write the run's report.html and picture; a failure is logged, never fatal
        to the run (``strict`` raises it instead, for `preflight report`)."""
        from bot.reporting import write_report

        try:
            return write_report(self.store, run_id)
        except Exception:
            if strict:
                raise
            log.exception("writing the report of run %s failed", run_id)
            return None

    def _runner_died(self, run_id: str) -> None:
        run = self.store.get_run(run_id)
        handle = self._handle(run)
        code = self._dispatcher(run).exit_code(handle)
        events = self.store.events(run_id, after_seq=max(0, int(run["last_seq"]) - 1))
        error = runner_death(run.get("stage_reached"), code, events[-1] if events else None,
                             self._dispatcher(run).log_tail(handle))
        self.store.interrupt_stages(run_id)  # the stage that ran did not pass or fail
        verdict = {"passed": False, "checks": [{"ok": False, "text": error["message"]}]}
        if self.store.transition(run_id, (S.RUNNING,), end_state(run), outcome="failed",
                                 first_error=run.get("first_error") or error, verdict=verdict,
                                 finished_at=_now(), exit_code=code):
            self._publish_outcome(run_id)

    def _recheck_balance(self, run: dict[str, Any], balance: dict[str, Any]) -> dict[str, Any]:
        """Apply the balance rules again to the item events the bot itself recorded."""
        from runner.balance import compute_balance

        items = self.store.items(run["id"])
        ours = compute_balance(run.get("expected_ids") or [], run.get("expected_refusals") or [],
                               run.get("categories") or [], items).to_dict()
        merged = {**balance, "items": [{k: i[k] for k in ("id", "status", "category", "reason")}
                                       for i in items]}
        disagreements = [k for k in ("accepted", "refused", "total")
                         if ours.get(k) != balance.get(k)]
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

    def _recorded(self, run_id: str, etype: str) -> dict[str, Any] | None:
        events = self._since_resume(run_id, etype)
        return dict(events[-1].data) if events else None

    def _since_resume(self, run_id: str, etype: str) -> list[Event]:
        """Events of a type written by the current runner (after the last resume)."""
        after = int(self.store.run_head(run_id).get("resume_seq") or 0)
        return self.store.events_of_type(run_id, etype, after_seq=after)

    # -- decide -------------------------------------------------------------------
    def decide(self, run_id: str, decision: str, reason: str, by: str, *,
               override: bool = False, source: str = "cli") -> dict[str, Any]:
        from bot.pilot.decisions import (
            already_decided,
            check_decision,
            not_decidable,
            override_needs,
        )

        run = self._with_decision(self.store.find_run(run_id))
        if decision == "approve":  # the lease gate judges the finish from now, not from then
            run["forecast"] = self.refresh_forecast(run["id"])
        reason = (reason or "").strip()
        origin: Origin = "slack" if source == "slack" else "cli"
        refusal, is_override = check_decision(run, decision, reason, by, override=override,
                                              groups=self.guard.identity(by, origin).groups)
        base = {"run": run["id"], "decision": decision, "reason": reason or "(none)", "by": by,
                "override": int(is_override), "source": source,
                "override_of": "; ".join(override_needs(run)) if is_override else None}
        policy = self.guard.approval(run, by, origin) if decision == "approve" and \
            refusal is None else []
        if policy:
            self.store.record_decision({**base, "accepted": 0, "refusal": str(policy[0])})
            raise PolicyRefused("approve", policy)
        if refusal is not None:
            self.store.record_decision({**base, "accepted": 0, "refusal": refusal})
            self.write_report(run["id"])  # the report lists refused attempts too
            raise DecisionRefused(refusal)
        # Under the run's lock: the outcome (with the buttons) is always published before the
        # decision replaces it, even when a click races the follower that finished the run.
        with self._run_lock(run["id"]):
            record = self.store.decide_run(run["id"], base)
            if record is None:  # another decision won the race
                current = self._with_decision(self.store.get_run(run["id"]))
                refusal = not_decidable(current) or already_decided(current)
                self.store.record_decision({**base, "accepted": 0, "refusal": refusal})
                raise DecisionRefused(refusal)
            self._publish(views.decision_message(self.store.get_run(run["id"]),
                                                 self.store.decisions(run["id"])))
        self.write_report(run["id"])
        if decision == "approve":
            record["volume_run"] = self._launch_volume(run["id"])
            if record["volume_run"]:  # the decision message names the volume it launched
                self._publish(views.decision_message(
                    {**self.store.get_run(run["id"]), "volume_run": record["volume_run"]},
                    self.store.decisions(run["id"])))
        return record

    def decision_refusal(self, run_id: str, *,
                         who: Callable[[str], str] = str) -> str | None:
        """Why a decision cannot be taken on this run now (None: it can); ``who`` renders
        the author of an earlier decision."""
        from bot.pilot.decisions import not_decidable

        return not_decidable(self._with_decision(self.store.find_run(run_id)), who=who)

    def _with_decision(self, run: dict[str, Any]) -> dict[str, Any]:
        """The run with its accepted decision and the volume run it launched, if any."""
        accepted = [d for d in self.store.decisions(run["id"]) if d.get("accepted")]
        return {**run, "decision": accepted[-1] if accepted else None,
                "volume_run": self.store.volume_of(run["id"])}

    def _launch_volume(self, run_id: str) -> str | None:
        run = self.store.get_run(run_id)
        loaded = load_manifest(run["manifest_text"], source=f"run {run_id}",
                               base_dir=_base_dir(run))
        volume = loaded.manifest.volume
        if volume is None:
            return None
        sub = self.submit(loaded, submitter=run["submitter"], channel=run.get("channel"),
                          thread_ts=run.get("thread_ts"), kind="volume", parent=run_id,
                          inputs=volume.inputs, origin="slack" if run.get("channel") else "cli")
        self.start(sub.run_id)
        return sub.run_id

    # -- read (the rest is in bot.records) ------------------------------------------
    def thread_messages(self, run_id: str) -> list[Message]:
        """Every message of the run's thread as it stands now (for re-rendering)."""
        run = self.store.get_run(run_id)
        out: list[Message | None] = [views.plan_message(run), self._status(run_id),
                                     cards_message(run, self.store.stages(run_id)),
                                     self._volume_notes(run)]
        if run["status"] == S.DISPATCH_FAILED:
            out.append(views.first_error_message(run))
        if run["status"] in ENDED:
            out += [views.first_error_message(run), views.balance_message(run, _csv(run)),
                    views.evidence_message(run), with_report(views.verdict_message(run), run),
                    forecast_message(run),
                    views.decision_message({**run, "volume_run": self.store.volume_of(run_id)},
                                           self.store.decisions(run_id))]
        return [m for m in out if m is not None]

    def close(self) -> None:
        """Close what the dispatchers hold open (SSH sessions and their event loop)."""
        for dispatcher in self.dispatchers.values():
            dispatcher.close()

    # -- helpers ------------------------------------------------------------------
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
                         project_dir=Path(_project_dir(run)), pid=run.get("pid"), resume=resume,
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

    def _publish_outcome(self, run_id: str) -> None:
        self.write_report(run_id)  # every run that ended has one, whichever way it ended
        for message in self.thread_messages(run_id)[1:]:
            self._publish(message)

    def _publish(self, message: Message) -> None:
        try:
            self.notifier.publish(message)
        except PreflightError:
            raise
        except Exception:  # a transport failure must never lose the recorded state
            log.exception("publishing %s of run %s failed", message.key, message.run_id)


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


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _base_dir(run: dict[str, Any]) -> Path:
    return Path(run["base_dir"])


def _project_dir(run: dict[str, Any]) -> str:
    return str(run["project_dir"])


def _csv(run: dict[str, Any]) -> str | None:
    path = Path(run["run_dir"]) / "balance.csv"
    return str(path) if path.exists() else None


