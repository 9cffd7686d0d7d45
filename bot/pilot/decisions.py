"""The rules of a decision after a pilot (DESIGN.md, "Decisions")."""

from __future__ import annotations

import re
from typing import Any

DECISIONS = ("approve", "fix-env", "revise")
_OVERRIDE = re.compile(r"\boverride\b", re.IGNORECASE)


def check_decision(run: dict[str, Any], decision: str, reason: str, by: str, *,
                   override: bool = False) -> tuple[str | None, bool]:
    """Return (refusal or None, whether this is an override of a failed pilot)."""
    if decision not in DECISIONS:
        return f"unknown decision {decision!r}: choose one of {', '.join(DECISIONS)}", False
    if not reason:
        return "a reason is required for every decision", False
    if run["status"] == "decided":
        return f"run {run['id']} is already decided", False
    if run["status"] != "awaiting_decision":
        return f"run {run['id']} is {run['status']}: decide once the pilot has finished", False
    if decision != "approve":
        return None, False
    approvers = list(run.get("approvers") or [])
    if not approvers:
        return ("nobody may approve this pilot: list approvers in approvals.approvers "
                "or PREFLIGHT_APPROVERS"), False
    if by not in approvers:
        names = ", ".join(approvers)
        return f"{by} is not an approver of {run['name']} (approvers: {names})", False
    if run.get("two_person") and by == run.get("submitter"):
        return ("two-person rule: the submitter cannot approve their own pilot; "
                "another approver must"), False
    if run.get("outcome") != "passed":
        if not (override or _OVERRIDE.search(reason)):
            return ("the pilot failed: approving it needs an explicit override "
                    "(say `override` in the reason, or --override, and why)"), False
        return None, True
    return None, False
