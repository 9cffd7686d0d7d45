"""Deciding a pilot: approve (which launches its volume), fix-env or revise, each recorded
with who, when and why; the checks an approval passes first (the policy, the decision
rules, the volume it would launch: its inputs, its nodes' leases); an approval whose volume
run cannot even be created is undone and the pilot awaits its decision again.

``PilotService`` holds one (``Decider``) and hands it the volume's launch (submit and start are the
service's own)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bot.errors import (
    DecisionRefused,
    DispatchError,
    LeaseError,
    ManifestError,
    PolicyRefused,
    PreflightError,
)
from bot.manifest.load import LoadedManifest, load_manifest
from bot.messages import views
from bot.pilot.payloads import StoredForecast
from bot.pilot.volume_nodes import volume_node
from bot.policy.guard import PolicyGuard
from bot.policy.model import Origin
from bot.service.handles import base_dir_of
from bot.service.publisher import Publisher
from bot.service.starter import LeaseGuard
from bot.store import Run, Store
from runner.errors import RunnerError

log = logging.getLogger(__name__)


class Decider:
    """Takes the decisions on pilots, over the store, the policy's guard and the publisher."""

    def __init__(self, store: Store, guard: PolicyGuard, publisher: Publisher, *,
                 lease_guard: LeaseGuard | None,
                 refresh_forecast: Callable[[str, Run], StoredForecast | None],
                 launch_volume: Callable[[Run, LoadedManifest], str | None]) -> None:
        """``refresh_forecast``: the pilot's forecast again, from now (the lease gate
        judges an approval's finish from now); ``launch_volume``: create and start the
        volume run of an approved pilot from its manifest as checked at the approval (its
        id; None without a volume section)."""
        self.store = store
        self.guard = guard
        self.publisher = publisher
        self.lease_guard = lease_guard
        self.refresh_forecast = refresh_forecast
        self.launch_volume = launch_volume

    def decide(self, run_id: str, decision: str, reason: str, by: str, *,
               override: bool = False, source: str = "cli",
               channel: str | None = None) -> dict[str, Any]:
        from bot.pilot.decisions import check_decision, override_needs

        run = self.with_decision(self.store.find(run_id))
        # From Slack: the run's own channel, and for fix-env/revise a role (PolicyRefused).
        self.guard.run_action(decision, run, by, "slack" if source == "slack" else "cli",
                              channel)
        if decision == "approve":  # the lease gate judges the finish from now, not from then
            run = replace(run, forecast=self.refresh_forecast(run.id, run))
        reason = (reason or "").strip()
        origin: Origin = "slack" if source == "slack" else "cli"
        refusal, is_override = check_decision(run, decision, reason, by, override=override,
                                              groups=self.guard.identity(by, origin).groups)
        base = {"run": run.id, "decision": decision, "reason": reason or "(none)", "by": by,
                "override": int(is_override), "source": source,
                "override_of": "; ".join(override_needs(run)) if is_override else None}
        policy = self.guard.approval(run, by, origin) if decision == "approve" and \
            refusal is None else []
        if policy:
            self.store.record_decision({**base, "accepted": 0, "refusal": str(policy[0])})
            raise PolicyRefused("approve", policy)
        loaded = None
        if refusal is None and decision == "approve":
            loaded, refusal = self._volume_check(run)
        if refusal is not None:
            self.store.record_decision({**base, "accepted": 0, "refusal": refusal})
            self.publisher.write_report(run.id)  # the report lists refused attempts too
            raise DecisionRefused(refusal)
        return self._accept_decision(run, base, loaded)

    def _accept_decision(self, run: Run, base: dict[str, Any],
                         loaded: LoadedManifest | None) -> dict[str, Any]:
        """Record an allowed decision (unless another won the race), publish it, and launch
        the volume of an approval (``loaded``: the pilot's manifest, as checked now)."""
        from bot.pilot.decisions import already_decided, not_decidable

        run_id = run.id
        # Under the run's lock: the outcome (with the buttons) is always published before the
        # decision replaces it, even when a click races the follower that finished the run.
        with self.publisher.run_lock(run_id):
            record = self.store.decide_run(run_id, base)
            if record is None:  # another decision won the race
                current = self.with_decision(self.store.run(run_id))
                refusal = not_decidable(current) or already_decided(current)
                self.store.record_decision({**base, "accepted": 0, "refusal": refusal})
                raise DecisionRefused(refusal)
            decided = self.store.run(run_id)  # read once: the message, the report
            self.publisher.publish(views.decision_message(decided,
                                                 self.store.decisions(run_id)))
        self.publisher.write_report(run_id, run=decided)
        if base["decision"] == "approve" and loaded is not None:
            record["volume_run"] = self._launch_or_reopen(run, record, loaded)
            if record["volume_run"]:  # the decision message names the volume it launched
                self.publisher.publish(views.decision_message(
                    decided.joined(volume_run=record["volume_run"]),
                    self.store.decisions(run_id)))
        return record

    def decision_refusal(self, run_id: str, *,
                         who: Callable[[str], str] = str) -> str | None:
        """Why a decision cannot be taken on this run now (None: it can); ``who`` renders
        the author of an earlier decision."""
        from bot.pilot.decisions import not_decidable

        return not_decidable(self.with_decision(self.store.find(run_id)), who=who)

    def with_decision(self, run: Run) -> Run:
        """The run with its accepted decision and the volume run it launched, if any."""
        accepted = [d for d in self.store.decisions(run.id) if d.get("accepted")]
        return run.joined(decision=accepted[-1] if accepted else None,
                          volume_run=self.store.volume_of(run.id))

    def _volume_check(self, run: Run) -> tuple[LoadedManifest | None, str | None]:
        """The pilot's manifest as its files are now, and why the volume an approval would
        launch cannot be created or started (its inputs folder, count, ids; its nodes'
        leases), checked before the approval is recorded (None when it can). The run's
        manifest, validated when it was read, is not validated again."""
        from bot.pilot.prechecks import volume_problems

        try:
            loaded = load_manifest(run.manifest_text or "", source=f"run {run.id}",
                                   base_dir=base_dir_of(run), validated=run.manifest)
        except ManifestError as exc:  # the project's files changed since the pilot
            return None, self._cannot_launch([str(p) for p in exc.problems])
        problems = [str(p) for p in volume_problems(loaded)]
        if not problems and self.lease_guard is not None and loaded.manifest.volume:
            try:  # the volume's nodes, as its dispatch will check them
                self.lease_guard(replace(run, kind="volume", node=volume_node(
                    loaded.manifest).model_dump(mode="json")))
            except LeaseError as exc:
                problems = [str(exc)]
        return loaded, self._cannot_launch(problems) if problems else None

    @staticmethod
    def _cannot_launch(problems: list[str]) -> str:
        return ("the volume cannot be launched: " + "; ".join(problems) + ". Fix it (the "
                "folder, the lease, or the manifest in a new attempt) and approve again")

    def _launch_or_reopen(self, run: Run, record: dict[str, Any],
                          loaded: LoadedManifest) -> str | None:
        """Launch the volume of an approval. When its run cannot even be created, the
        approval is undone (kept as refused, with why) and the pilot awaits its decision
        again; once the volume's run exists, a failed start is that run's to resume."""
        run_id = run.id
        try:
            return self.launch_volume(run, loaded)
        except Exception as exc:
            if not isinstance(exc, (PreflightError, RunnerError, OSError)):
                log.exception("launching the volume of %s failed", run_id)
            volume = self.store.volume_of(run_id)
            if volume is not None:
                raise DispatchError(
                    f"the approval of {run_id} is recorded and its volume run {volume} was "
                    f"created, but it did not start: {exc}. `preflight resume {volume}` "
                    "tries again") from exc
            why = f"the volume run was not created: {type(exc).__name__}: {exc}"
            self.store.reopen_decision(run_id, int(record["id"]), why)
            self.publisher.publish(views.decision_message(self.store.run(run_id),
                                                 self.store.decisions(run_id)))
            self.publisher.write_report(run_id)
            raise DecisionRefused(
                f"the approval of {run_id} is not recorded: {why}. The pilot awaits its "
                f"decision again: `preflight decide {run_id} approve --reason \"…\"` once "
                "fixed") from exc

