"""PilotService: the commands of a run (submit, resume, stop, and an approval's volume)
over the parts that do the rest. submit → plan → dispatch → follow → decide.

It knows no Slack and no SQL: it is given a store, dispatchers (by node kind) and a
notifier. It is built by composition, and hands nothing on: a transport (console, Slack,
CLI) uses the part it needs directly: ``records`` (what it reads, bot/service/records.py),
``starter`` (start a run), ``decider`` (decide a pilot), ``follower`` (follow, pump,
reap), ``publisher`` (the thread's messages, the report), ``watch`` (the scheduled looks)
and ``retention`` (the database's usage and prune). The service's own methods are the
commands that need several parts at once; a new run's directory is ``run_dirs.py``'s.
Every event is recorded in the store before any message is published, and the follower's
position is stored with it, so a restarted bot continues from the last consumed ``seq``
without losing or repeating posts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bot.dispatch.base import Dispatcher
from bot.dispatch.inputs_check import record_listing
from bot.errors import (
    DecisionRefused,
    DispatchError,
)
from bot.manifest.load import LoadedManifest, load_manifest, parse_manifest
from bot.manifest.model import Inputs, VolumeInputs
from bot.manifest.project_check import git_commit
from bot.messages import views
from bot.messages.model import Notifier
from bot.pilot.clock import now_utc
from bot.pilot.fetch_caps import caps_of
from bot.pilot.plan import make_plan
from bot.pilot.record import remember_manifest
from bot.pilot.specbuild import build_spec
from bot.pilot.states import S, resume_refusal
from bot.pilot.volume_nodes import volume_node
from bot.policy import Policy, default_policy
from bot.policy.guard import Directory, PolicyGuard
from bot.policy.model import Origin
from bot.service.decisions import Decider
from bot.service.end_lock import end_lock
from bot.service.follower import DISPATCH_GRACE_S, Follower
from bot.service.handles import dispatcher_for, handle_for
from bot.service.proven import ProvenForecast
from bot.service.publisher import Publisher
from bot.service.records import Records
from bot.service.retention import Retention
from bot.service.run_checks import refuse_evidence_place
from bot.service.run_dirs import create_run, new_run_dir
from bot.service.starter import LeaseGuard, Starter
from bot.service.watch import Watch
from bot.settings import Settings
from bot.store import Run, Store

log = logging.getLogger(__name__)

# The manifest and project checks that stop a pilot before it is planned (ProjectCheckError).
Precheck = Callable[[LoadedManifest], object]


@dataclass(frozen=True)
class Submission:
    run_id: str
    run_dir: Path
    loaded: LoadedManifest


class PilotService:
    def __init__(self, settings: Settings, store: Store, dispatchers: Mapping[str, Dispatcher],
                 notifier: Notifier, *, lease_guard: LeaseGuard | None = None,
                 precheck: Precheck | None = None, progress_interval: float = 0.2,
                 policy: Policy | None = None, directory: Directory | None = None) -> None:
        """``directory``: who is in which user group (the Slack transport's), for the
        policy's roles that name a group."""
        self.settings = settings
        self.store = store
        # The policy's guard, one object shared with the records and the decider.
        self.guard = PolicyGuard(policy or default_policy(settings.home, settings.policy_path,
                                                           settings.approvers), store,
                                  directory=directory)
        self.dispatchers = dict(dispatchers)  # by node kind, shared with the parts
        self.precheck = precheck
        self._lock = threading.Lock()  # one new run directory at a time
        self.records = Records(store, self.guard)
        self.retention = Retention(store, settings.retention_days)
        self.publisher = Publisher(store, notifier, progress_interval=progress_interval)
        self.follower = Follower(settings, store, self.dispatchers, self.publisher)
        self.starter = Starter(store, self.dispatchers, self.publisher,
                               ProvenForecast(store), lease_guard=lease_guard)
        self.watch = Watch(store, self.follower, self.publisher, self.stop)
        self.decider = Decider(store, self.guard, self.publisher,
                               lease_guard=lease_guard,
                               refresh_forecast=self.follower.refresh_forecast,
                               launch_volume=self._launch_volume)

    # -- submit -------------------------------------------------------------------
    def submit_text(self, text: str, *, source: str, base_dir: Path, submitter: str,
                    channel: str | None = None, thread_ts: str | None = None,
                    origin: Origin = "cli") -> Submission:
        loaded = self.load(text, source=source, base_dir=base_dir, user=submitter, origin=origin,
                           channel=channel)
        return self.submit(loaded, submitter=submitter, channel=channel, thread_ts=thread_ts,
                           origin=origin)

    def load(self, text: str, *, source: str, base_dir: Path, user: str,
             origin: Origin, channel: str | None = None) -> LoadedManifest:
        """Load manifest text, refused by the policy (PolicyRefused) before any path it
        names is looked at (``channel``: where a Slack manifest came from; its roots).

        The text is parsed once and its inputs folders listed once (by the manifest's
        rules); the policy's file check runs here, before the project check opens the
        files, and ``submit`` does not run it again for the same user, origin and channel.
        """
        parsed = parse_manifest(text, source=source)
        self.guard.screen(parsed, source=source, base_dir=base_dir, user=user, origin=origin,
                          channel=channel)
        loaded = load_manifest(text, source=source, base_dir=base_dir, parsed=parsed)
        return self.guard.screened(loaded, user=user, origin=origin, channel=channel)

    def submit(self, loaded: LoadedManifest, *, submitter: str, channel: str | None = None,
               thread_ts: str | None = None, kind: str = "pilot", parent: str | None = None,
               inputs: Inputs | VolumeInputs | None = None, origin: Origin = "cli",
               forecast: Mapping[str, Any] | None = None) -> Submission:
        """Plan an attempt and prepare its own new run directory; nothing is started yet.

        The policy is checked here whoever calls (PolicyRefused, recorded, nothing created).
        """
        from bot.pilot.prechecks import expected_inputs, previous_changes

        approvers, two_person = self.guard.admit(loaded, user=submitter, origin=origin,
                                                 inputs=inputs, channel=channel)
        if self.precheck is not None and kind == "pilot":  # a volume was checked as its pilot
            self.precheck(loaded)
        m = loaded.manifest
        refuse_evidence_place(loaded, self.settings)  # never a run directory (issue 32)
        plan = make_plan(loaded, caps=caps_of(self.settings), forecast=forecast)
        ids = expected_inputs(loaded, inputs)
        with self._lock:
            attempt, run_id, run_dir = new_run_dir(self.store, loaded, kind,
                                                   self.settings.runs_dir)
            spec = build_spec(loaded, plan, run_id, inputs=inputs, kind=kind,
                              forecast=forecast)
            spec = replace(spec, project=replace(  # what exactly ran: its git commit
                spec.project, commit=git_commit(Path(loaded.project_dir))))
            (run_dir / "manifest.yaml").write_text(loaded.text, encoding="utf-8")
            spec_path = run_dir / "spec.json"
            spec_path.write_text(spec.to_json(), encoding="utf-8")
            record_listing(run_dir, spec.inputs.dir,  # held to it at dispatch
                           [f.location for f in loaded.listing(inputs).files])
            manifest_json = remember_manifest(m)  # the run's readers share ``m``
            create_run(self.store, run_dir, {
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
            self.publisher.publish(views.plan_message(self.store.run(run_id)))
        return Submission(run_id, run_dir, loaded)

    # -- commands that need several parts --------------------------------------------
    def fetch(self, run_id: str) -> dict[str, Any]:
        """Bring an ended run's results back again, and judge it again on them while it
        awaits its decision (``bot/service/refetch.py``)."""
        from bot.service.refetch import fetch_again

        run = self.store.find(run_id)
        return fetch_again(self.store, dispatcher_for(self.dispatchers, run), self.publisher,
                           run.id)

    def resume(self, run_id: str) -> None:
        """Start a stopped run again from its ledger, or a run never started (a dispatch
        refused because the node's lease was not provisioned yet) for the first time."""
        run = self.store.run(run_id)
        self.guard.nodes_again(run, self.settings.user)  # a Slack run: its nodes, checked now
        if run.status == S.PLANNED:
            self.starter.start(run_id)
            return
        if run.status == S.DISPATCHING:
            self.follower.reap(run_id)  # settles a start interrupted more than DISPATCH_GRACE_S ago
            run = self.store.run(run_id)
            if run.status == S.DISPATCHING:
                raise DispatchError(f"run {run_id} is being started; if the bot that started "
                                    f"it stopped, try again in {DISPATCH_GRACE_S} s")
        if run.status == S.DECIDED:
            raise DispatchError(f"run {run_id} is decided; submit the manifest again instead")
        finished = resume_refusal(run)
        if finished is not None:
            raise DispatchError(finished)
        if run.status == S.RUNNING and \
                dispatcher_for(self.dispatchers, run).is_alive(handle_for(run)):
            raise DispatchError(f"run {run_id} is still running; nothing to resume")
        self.starter.start(run_id, resume=True)

    def stop(self, run_id: str, *, by: str, reason: str, timeout: float = 60,
             wait: bool = True, origin: Origin = "cli",
             channel: str | None = None) -> dict[str, Any]:
        """Stop a running run: its runner and everything it started, recorded as ``stopped``
        with who and why. The ledger keeps the finished items; `resume` continues.

        ``wait``: follow the run until it is closed (a transport that already follows it,
        like Slack's followers, passes False). From Slack (``origin``, ``channel``): only
        its submitter, an approver or an admin, from the run's own channel (PolicyRefused).
        """
        run = self.store.find(run_id)
        self.guard.run_action("stop", run, by, origin, channel)
        reason = (reason or "").strip()
        if not reason:
            raise DecisionRefused("a reason is required to stop a run")
        stop = {"by": by, "reason": reason, "at": now_utc()}
        if self.store.transition(run.id, (S.DISPATCHING,), S.STOPPED, stop=stop,
                                 finished_at=now_utc()):
            # Being started: the start ends at its next step (DispatchStopped) and stops
            # what it started; what is already up (Ray on the nodes) is stopped here too,
            # also when the bot that started it is gone.
            self.starter.stop_quietly(run.id, handle_for(self.store.run_record(run.id)))
            self.publisher.publish_outcome(run.id)
            return self.store.get_run(run.id)
        if not self.store.transition(run.id, (S.RUNNING,), S.RUNNING, stop=stop):
            current = self.store.run_record(run.id).status
            raise DispatchError(f"run {run.id} is {current}: only a running run can be "
                                "stopped, or one being started")
        with end_lock(run.run_dir, run.id, f"stopping its runner for {by}"):
            # another bot process may be ending it meanwhile: then nothing is left to stop
            record = self.store.run_record(run.id)
            if record.status == S.RUNNING:
                dispatcher_for(self.dispatchers, record).stop(handle_for(record))
        return self.follower.follow(run.id, timeout=timeout) if wait else self.store.get_run(run.id)

    def _launch_volume(self, run: Run, loaded: LoadedManifest) -> str | None:
        """Submit and start the volume run of ``run``, an approved pilot, from its manifest
        as the approval checked it."""
        run_id = run.id
        volume = loaded.manifest.volume
        if volume is None:
            return None
        # the pilot's forecast gives the volume's time limit
        sub = self.submit(loaded, submitter=str(run.submitter), channel=run.channel,
                          thread_ts=run.thread_ts, kind="volume", parent=run_id,
                          inputs=volume.inputs, origin="slack" if run.channel else "cli",
                          forecast=run.forecast.values if run.forecast else None)
        self.starter.start(sub.run_id)
        return sub.run_id

    def close(self) -> None:
        """Close what the dispatchers hold open (SSH sessions and their event loop)."""
        for dispatcher in self.dispatchers.values():
            dispatcher.close()
