"""What the transports read, and the lease records they change: the records reader.

``PilotService`` holds a ``Records`` (``service.records``), so that Slack, the console
and the CLI never reach into the store: they ask it for a run, the runs, the decisions,
a thread's run, a run's outputs, or record a lease change (whose rules are ``bot.pilot.leases``,
applied on the store by ``bot.service.leases``).
"""

from __future__ import annotations

from typing import Any

from bot.errors import RunNotFound
from bot.pilot import leases as lease_rules
from bot.pilot.cards import healthy_cards
from bot.policy import checks
from bot.policy.guard import PolicyGuard
from bot.policy.model import Origin
from bot.service.leases import set_state
from bot.service.outputs import ItemOutput, OutputsPlace, item_output, outputs_place
from bot.store import Run, RunRecord, Store


class Records:
    """Read access to the runs and the lease records, on the service's store and guard."""

    def __init__(self, store: Store, guard: PolicyGuard) -> None:
        self.store = store
        self.guard = guard

    # -- runs, typed (bot.pilot.record.Run): what the transports read -------------------
    def record(self, run_id: str) -> Run:
        """The run with exactly this id (RunNotFound otherwise)."""
        return self.store.run(run_id)

    def head(self, run_id: str) -> RunRecord:
        """The run's record with exactly this id: its identity, state, thread and place,
        none of its payloads parsed (what a check of where or whether reads)."""
        return self.store.run_record(run_id)

    def find_record(self, run_id: str, *, channel: str | None = None) -> Run:
        """The run with this id, ``latest``, a pilot's name or a unique id prefix, as a
        person types it; ``channel``: among that channel's runs only (``find_in``)."""
        if channel is None:
            return self.store.find(run_id)
        return self.store.run(str(self.find_in(run_id, channel)["id"]))

    def records(self, limit: int = 50, *, channel: str | None = None) -> list[Run]:
        """The newest runs; ``channel``: only that channel's (what a Slack channel sees)."""
        return self.store.runs(limit=limit, channel=channel)

    def records_for(self, user: str, limit: int = 50) -> list[Run]:
        """The runs a Slack user is in scope for (their App Home): those they submitted or
        may approve, every run for an admin."""
        who = self.guard.identity(user, "slack")
        admin = checks.holds(self.guard.policy, "admins", who)
        return [r for r in self.store.runs(limit=max(limit, 200))
                if admin or r.submitter == user or who.ids() & set(r.approvers)][:limit]

    def running(self) -> list[Run]:
        """The runs whose runner is running (what a restarted follower picks up)."""
        return self.store.running()

    def stages(self, run_id: str) -> list[dict[str, Any]]:
        """The run's stages, in order, with their facts and errors."""
        return self.store.stages(run_id)

    # -- runs as the store holds them (dicts: scripts, `show --json`, tests) ------------
    def run(self, run_id: str) -> dict[str, Any]:
        """The run with exactly this id (RunNotFound otherwise)."""
        return self.store.get_run(run_id)

    def find(self, run_id: str) -> dict[str, Any]:
        """The run with this id or unique id prefix, as a person types it."""
        return self.store.find_run(run_id)

    def find_in(self, run_id: str, channel: str) -> dict[str, Any]:
        """Like ``find``, among the runs of ``channel`` only: an id, ``latest``, a pilot's
        name or a unique id prefix; another channel's runs are never named, not even in
        a did-you-mean."""
        mine = self.store.list_runs(limit=1000, channel=channel)
        hits = ([r for r in mine if r["id"] == run_id]
                or (mine[:1] if run_id == "latest" else [])
                or [r for r in mine if r["name"] == run_id][:1]
                or [r for r in mine if run_id and r["id"].startswith(run_id)])
        if len(hits) != 1:
            raise RunNotFound(run_id, "no run of this channel has that id or name" if not hits
                              else f"{len(hits)} runs of this channel start with it: type "
                                   "more of the id")
        return hits[0]

    def runs(self, limit: int = 50, *, channel: str | None = None) -> list[dict[str, Any]]:
        """The newest runs; ``channel``: only that channel's (what a Slack channel sees)."""
        return self.store.list_runs(limit=limit, channel=channel)

    def runs_for(self, user: str, limit: int = 50) -> list[dict[str, Any]]:
        """The runs a Slack user is in scope for (their App Home): those they submitted or
        may approve, every run for an admin."""
        who = self.guard.identity(user, "slack")
        admin = checks.holds(self.guard.policy, "admins", who)
        return [r for r in self.store.list_runs(limit=max(limit, 200))
                if admin or r.get("submitter") == user
                or who.ids() & set(r.get("approvers") or [])][:limit]

    def decisions_for(self, user: str, limit: int = 20) -> list[dict[str, Any]]:
        """The recent decisions on the runs ``runs_for`` shows that user."""
        ids = {r["id"] for r in self.runs_for(user, limit=200)}
        return [d for d in self.store.decisions(limit=max(limit, 200))
                if d["run"] in ids][:limit]

    def active_runs(self) -> list[dict[str, Any]]:
        """The runs whose runner is running (what a restarted follower picks up)."""
        return self.store.active_runs()

    def show(self, run_id: str, *, channel: str | None = None) -> dict[str, Any]:
        """A run with its stages and decisions; ``channel``: only a run of that channel
        (RunNotFound otherwise: a channel does not see another's runs)."""
        run = self.store.find_run(run_id) if channel is None else self.find_in(run_id, channel)
        return {**run, "stages": self.store.stages(run["id"]),
                "decisions": self.store.decisions(run["id"]),
                "volume_run": self.store.volume_of(run["id"]),
                "healthy_cards": healthy_cards(self.store.stages(run["id"]))}

    def healthy_cards(self, run_id: str) -> list[int] | None:
        """The cards the run proved healthy (bot.pilot.cards): the ones a volume may use.
        None when no card stage reported (a run that stopped before ``device``)."""
        return healthy_cards(self.store.stages(self.store.find_run(run_id)["id"]))

    def decisions(self, run_id: str | None = None, *, limit: int = 50) -> list[dict[str, Any]]:
        return self.store.decisions(run_id, limit=limit)

    def run_for_thread(self, channel: str, thread_ts: str) -> str | None:
        """The run a chat thread belongs to, if any."""
        return self.store.run_for_thread(channel, thread_ts)

    def claim_event(self, event_id: str) -> bool:
        """True the first time a transport's event id is seen (a retried delivery: False)."""
        return self.store.claim_slack_event(event_id)

    def may_act(self, run_id: str, action: str, user: str, *, channel: str | None) -> None:
        """From Slack (a button): PolicyRefused, recorded, unless ``user`` may ``action``
        (stop, approve, fix-env, revise) this run from ``channel``."""
        self.guard.run_action(action, self.store.run(run_id), user, "slack", channel)

    # -- outputs (bot/service/outputs.py) ---------------------------------------------
    def outputs_place(self, run_id: str) -> OutputsPlace:
        """Where the run's outputs lie on this host, and what is there."""
        return outputs_place(self.find_record(run_id))

    def item_output(self, run_id: str, item_id: str) -> ItemOutput:
        """Input ``item_id``'s outcome and its output, found by its id."""
        return item_output(self.store, self.find_record(run_id), item_id)

    # -- leases ---------------------------------------------------------------------
    def leases(self, *, include_ended: bool = True) -> list[dict[str, Any]]:
        return self.store.leases(include_ended=include_ended)

    def lease_of(self, node: str) -> dict[str, Any] | None:
        """The current lease of a node (``host`` or ``host:port``), if any."""
        return self.store.current_lease(lease_rules.normalize_node(node))

    def lease_changes(self, lease_id: int) -> list[dict[str, Any]]:
        return self.store.lease_changes(lease_id)

    def change_lease(self, node: str, state: str, user: str, *, origin: Origin,
                     note: str | None = None, starts_at: str | None = None,
                     days: int | None = None) -> dict[str, Any]:
        """One lease state change, refused by the policy (PolicyRefused, recorded) unless
        ``user`` may make it; recorded with who (``<@id>`` from Slack). LeaseError when the
        lease rules refuse it."""
        self.guard.lease_change(lease_rules.normalize_node(node), state, user, origin)
        by = f"<@{user}>" if origin == "slack" else user
        return set_state(self.store, node, state, by, note=note,
                                     starts_at=starts_at, days=days)
