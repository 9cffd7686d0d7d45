"""The rules of a decision after a pilot (DESIGN.md, "Decisions")."""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable

from bot.pilot.forecast import duration
from bot.pilot.record import Run
from bot.pilot.states import RunStatus, S

DECISIONS = ("approve", "fix-env", "revise")
_OVERRIDE = re.compile(r"\boverride\b", re.IGNORECASE)


def end_state(run: Run) -> RunStatus:
    """Where a run goes when its runner ends: ``stopped`` when someone stopped it; else a
    pilot awaits its decision, and a volume run (the full corpus an approval launched),
    which has no decision of its own, is finished."""
    if run.stop is not None:
        return S.STOPPED  # someone asked for it: who, when and why are in ``stop``
    return S.AWAITING_DECISION if run.kind == "pilot" else S.FINISHED


def volume_refusal(run: Run) -> str:
    """Why a volume run cannot be decided: its pilot's approval was the decision."""
    return (f"run {run.id} is the volume run of pilot {run.parent_run}: it has no "
            "scale-up decision of its own (the pilot's approval launched it, once); "
            f"`preflight resume {run.id}` continues it from its ledger if it stopped")


def already_decided(run: Run, *, who: Callable[[str], str] = str) -> str:
    """The refusal of a second decision, naming the first (``who`` renders its author, e.g.
    a Slack mention) and the volume it launched."""
    text = f"run {run.id} is already decided"
    first = run.decision
    if first:
        text += f": {first['decision']} by {who(first['by'])} at {first['at']}"
        if first.get("reason"):
            text += f" ({first['reason']})"
    if run.volume_run:
        text += f"; it already launched the volume run {run.volume_run}"
    return text


def not_decidable(run: Run, *, who: Callable[[str], str] = str) -> str | None:
    """Why no decision can be taken on this run now, or None: a decision comes only after
    the pilot has finished (``awaiting_decision``), once. ``run.decision`` is its
    accepted decision, if any (``already_decided``)."""
    if run.kind != "pilot":
        return volume_refusal(run)
    if run.status == S.DECIDED:
        return already_decided(run, who=who)
    if run.status != S.AWAITING_DECISION:
        return f"run {run.id} is {run.status}: decide once the pilot has finished"
    return None


def check_decision(run: Run, decision: str, reason: str, by: str, *,
                   override: bool = False,
                   groups: frozenset[str] = frozenset()) -> tuple[str | None, bool]:
    """Return (refusal or None, whether this is an override of a failed pilot).

    ``groups``: the Slack user groups ``by`` is in (an approvers list may name a group).
    """
    if run.kind != "pilot":
        return volume_refusal(run), False
    if decision not in DECISIONS:
        return f"unknown decision {decision!r}: choose one of {', '.join(DECISIONS)}", False
    if not reason:
        return "a reason is required for every decision", False
    refusal = not_decidable(run)
    if refusal is not None:
        return refusal, False
    if decision != "approve":
        return None, False
    approvers = list(run.approvers)
    if not approvers:
        return ("nobody may approve this pilot: list approvers in approvals.approvers "
                "or PREFLIGHT_APPROVERS"), False
    if by not in approvers and not groups & set(approvers):
        return not_an_approver(by, run.name, approvers), False
    if run.two_person and by == run.submitter:
        return ("two-person rule: the submitter cannot approve their own pilot; "
                "another approver must"), False
    needs = override_needs(run)
    if needs:
        if not (override or _OVERRIDE.search(reason)):
            return (f"{'; and '.join(needs)}: approving it needs an explicit override "
                    "(say `override` in the reason, or --override, and why)"), False
        return None, True
    return None, False


def not_an_approver(by: str, name: str, approvers: list[str]) -> str:
    """The refusal of an approval by someone not listed: the closest listed name (a typo in
    ``--by`` or in the manifest) and where the list comes from."""
    names = ", ".join(approvers)
    text = f"{by} is not an approver of {name} (approvers: {names})"
    near = difflib.get_close_matches(by.casefold(), [a.casefold() for a in approvers], n=1,
                                     cutoff=0.6)
    if near:
        match = next(a for a in approvers if a.casefold() == near[0])
        text += f"; did you mean {match!r}?"
    return (text + ". The list is the manifest's approvals.approvers (plus PREFLIGHT_APPROVERS "
            "or the policy's approvers): fix the name there, in a new attempt, if it is the "
            "list that is wrong")


def override_needs(run: Run) -> list[str]:
    """What an approval of this pilot would override: a failed pilot, and a volume whose
    high estimate ends after the lease (``bot.pilot.forecast``). Recorded with it."""
    needs = []
    if run.outcome != "passed":
        needs.append("the pilot failed")
    forecast = run.forecast
    if forecast is not None and forecast.fits is False:
        late = duration(-(forecast.number("margin_s") or 0.0))
        needs.append(f"the volume's high estimate ends {late} after the lease ends "
                     f"({forecast.text('lease_end')})")
    return needs
