"""The states of a run and the changes between them: the one table.

``planned`` (directory and spec written) → ``dispatching`` (the runner is being started) →
``running`` → ``awaiting_decision`` (a pilot whose runner finished), ``finished`` (a volume
run, which has no decision of its own) or ``stopped`` (someone stopped it) → ``decided``.
A start that fails ends in ``dispatch_failed``. ``preflight resume`` takes every state but
``planned``, ``dispatching`` and ``decided`` back to ``dispatching``: a run being started is
never started a second time (two drivers of one volume would each clean up the other's
Ray); nor is a run that finished and passed (``resume_refusal``: its work is complete).
``running → running`` records a stop request on a running run; ``dispatching →
stopped`` a stop while it is being started (the dispatch ends at its next step and stops
what it had started). The store refuses a
change this table does not list.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from bot.pilot.record import RunRecord


class RunStatus(StrEnum):
    PLANNED = "planned"
    DISPATCHING = "dispatching"
    RUNNING = "running"
    AWAITING_DECISION = "awaiting_decision"
    DECIDED = "decided"
    FINISHED = "finished"
    STOPPED = "stopped"
    DISPATCH_FAILED = "dispatch_failed"


S = RunStatus  # the short name the rules and the service use
# The states a run can be resumed from (its runner started once, or tried to).
RESUMABLE = frozenset({S.RUNNING, S.AWAITING_DECISION, S.FINISHED, S.STOPPED,
                       S.DISPATCH_FAILED})
# The runner has finished (or was stopped): the verdict, balance and evidence are known.
ENDED = frozenset({S.AWAITING_DECISION, S.DECIDED, S.FINISHED, S.STOPPED})
# What the App Home lists as still needing attention.
OPEN = frozenset({S.PLANNED, S.RUNNING, S.AWAITING_DECISION})

TRANSITIONS: dict[RunStatus, frozenset[RunStatus]] = {
    S.PLANNED: frozenset({S.DISPATCHING}),
    S.DISPATCHING: frozenset({S.RUNNING, S.DISPATCH_FAILED, S.STOPPED}),
    S.RUNNING: frozenset({S.RUNNING, S.AWAITING_DECISION, S.FINISHED, S.STOPPED,
                          S.DISPATCHING}),
    S.AWAITING_DECISION: frozenset({S.DECIDED, S.DISPATCHING}),
    S.FINISHED: frozenset({S.DISPATCHING}),
    S.STOPPED: frozenset({S.DISPATCHING}),
    S.DISPATCH_FAILED: frozenset({S.DISPATCHING}),
    S.DECIDED: frozenset(),
}


def resume_refusal(run: RunRecord) -> str | None:
    """Why ``preflight resume`` must not start ``run`` again, or None. A run whose runner
    finished and passed has done its work: a resume would run every stage again as a new
    attempt, change its stage times, its throughput and its forecast's score, and prove
    nothing new. A run stopped, failed or whose runner died mid-way still resumes, unless
    retention pruned its item rows: its balance re-check counts every attempt's items."""
    if run.items_pruned_at:
        return (f"run {run.id}: its item rows were pruned from the state database on "
                f"{run.items_pruned_at[:10]} (retention, PREFLIGHT_RETENTION_DAYS), and a "
                "resume's balance re-check needs every attempt's items; its results are in "
                f"{run.run_dir} (balance.csv); submit the manifest again for a new attempt")
    if run.outcome != "passed" or run.status not in (S.AWAITING_DECISION, S.FINISHED):
        return None
    if run.kind == "volume":
        return (f"run {run.id} finished and passed: its work is complete, nothing to resume "
                "(a resume would run every stage again as a new attempt); its results are "
                f"in {run.run_dir} and its report: `preflight report {run.id}`")
    return (f"run {run.id} finished and passed: its work is complete, nothing to resume (a "
            "resume would run every stage again as a new attempt); decide it: "
            f"`preflight decide {run.id} approve|fix-env|revise --reason \"…\"`, or submit "
            "the manifest again for a new attempt")


def allowed_sources(from_states: Iterable[str], to_state: str) -> list[str]:
    """Those of ``from_states`` from which the table lets a run go to ``to_state``."""
    target = RunStatus(to_state)
    return [str(s) for s in from_states if target in TRANSITIONS[RunStatus(s)]]
