"""The scheduled jobs' messages: a run that stalled or came back, a lease that ends or
ended, evidence not secured. Pure: what they say is decided from the records given."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any

from bot.messages.model import Fields, Heading, Message, Text
from bot.pilot.leases import LeaseAction
from bot.pilot.record import Run, RunRecord


def stall_message(run: RunRecord, after: timedelta) -> Message:
    stage = run.stage_reached or "(none yet)"
    last = run.last_event_at or "(no event yet)"
    minutes = int(after.total_seconds() // 60)
    text = (f"No event from run {run.id} for {minutes} min or more "
            f"(stall_after {int(after.total_seconds())} s). Last stage: {stage}; "
            f"last event at {last}.")
    return Message(run.id, key="alert-stall", summary=text, blocks=(
        Heading("Run stalled?"), Text(text, style="warn"),
        Fields((("last stage", stage), ("last event", last))),
        Text("The runner keeps going on its own; check the node (is the process stopped? "
             "out of memory? the SSH route down?). A return is announced here.", style="muted")))


def recovered_message(run: RunRecord, *, quiet_since: str | None) -> Message:
    stage = run.stage_reached or "(none yet)"
    text = (f"Run {run.id} is reporting again (stage {stage}, last event at "
            f"{run.last_event_at}).")
    return Message(run.id, key="alert-recovered", summary=text, blocks=(
        Heading("Run back"), Text(text, style="ok"),
        Fields((("stalled since", quiet_since or "?"), ("status", str(run.status))))))


def lease_message(action: LeaseAction, runs: Sequence[Run],
                  pending: list[str], now: datetime) -> Message:
    anchor = runs[-1].id if runs else f"lease-{action.node}"
    end = iso(action.end)
    if action.kind == "end":
        head, text = "Lease ended", f"The lease of {action.node} ended at {end}."
    else:
        left = action.end - now
        hours = max(0, int(left.total_seconds() // 3600))
        head = f"Lease ends in {action.hours} h"
        text = f"The lease of {action.node} ends at {end} (about {hours} h left)."
    lines = "\n".join(f"• {p}" for p in pending) if pending else "Everything is secured."
    return Message(anchor, key=f"alert-lease-{action.kind}-{action.hours or 'end'}",
                   summary=f"{text} Not yet secured: {len(pending)}.", blocks=(
                       Heading(head), Text(text, style="warn"),
                       Text(("Not yet secured:\n" + lines) if pending else lines,
                            style="warn" if pending else "ok"),
                       Text("A file on the compute machine is not a backup: copy and verify "
                            "the evidence before the end.", style="muted")))


def evidence_message(row: dict[str, Any]) -> Message:
    text = (f"The balance of {row['id']} has existed since {row['balance_at']} but its "
            "evidence is not verified: copy it to a place you control and verify it "
            "(`preflight verify`).")
    return Message(row["id"], key="alert-evidence", summary=text, blocks=(
        Heading("Evidence not secured"), Text(text, style="warn")))


def iso(moment: datetime) -> str:
    """A moment as the watch records it (UTC, microseconds)."""
    return moment.astimezone(timezone.utc).isoformat(timespec="microseconds")
