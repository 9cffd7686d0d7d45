"""Lease rules: the states of a rented node, the dispatch guard and the reminder plan.

"I have paid" is not "the machine is ready": a lease moves one step at a time through
``ordered → payment-notified → funds-confirmed → provisioned → ended`` (``ended`` may be
recorded from any state: a cancelled order ends too), each change with who and when. No
run is dispatched to an SSH node whose current lease is not ``provisioned``.

These are the rules only: the lease records are changed, and a dispatch is checked against
them, by ``bot.service.leases`` (on the store).

A node is known by its address, ``host`` or ``host:port`` (``lease_key``): rental markets
give several machines one public host told apart by the SSH port (``ssh5.example.net:41022``
and ``ssh5.example.net:41023`` are two rentals with their own terms), so a lease is never
shared by two ports. Port 22 is left out (``gpu-1.example.net``), host names are compared in
lower case, and an IPv6 address with a port is written ``[::1]:2222``. The user is not part
of the key: two logins on one machine rent the same machine.

The reminder plan is a pure function of the lease, the runs on its node and ``now``, so
the scheduled job is tested by calling it with an explicit time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any

from bot.errors import LeaseError
from bot.manifest.nodes import node_model
from bot.pilot.clock import read_time
from bot.pilot.record import Run
from bot.pilot.states import S

STATES = ("ordered", "payment-notified", "funds-confirmed", "provisioned", "ended")
ORDERED, PAYMENT_NOTIFIED, FUNDS_CONFIRMED, PROVISIONED, ENDED = STATES
STATE_PATH = " → ".join(STATES)  # how help texts show the way a lease goes
REMINDER_HOURS = (24, 2)
SYSTEM = "preflight"


def node_key(node: dict[str, Any] | None) -> str | None:
    """The lease key of a manifest node section; None for a local node (no lease)."""
    model = node_model(node) if node else None
    if node is None or model is None or not model.is_remote:
        return None
    host = node.get("host")
    return lease_key(str(host), int(node.get("port") or 22)) if host else None


def lease_key(host: str, port: int = 22) -> str:
    """``host`` for port 22, else ``host:port`` (``[v6]:port``); the host in lower case."""
    host = host.strip().lower()
    if port == 22:
        return host
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def split_key(key: str) -> tuple[str, int]:
    """The host and port of a lease key; raises LeaseError naming a bad port."""
    text = key.strip()
    if text.startswith("["):  # [v6]:port or [v6]
        host, _, rest = text[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, port = text.split(":")
    else:  # a bare host, or an IPv6 address without a port
        host, port = text, ""
    if not port:
        return host.lower(), 22
    if not port.isdigit() or not 1 <= int(port) <= 65535:
        raise LeaseError(f"node {key!r}: the port after ':' must be a number from 1 to 65535")
    return host.lower(), int(port)


def steps_to_provisioned(node: str, state: str) -> str:
    """The whole way from ``state`` to ``provisioned``, each step the command that records
    it (a lease moves one step at a time; "the next step" alone left a team guessing how
    many were left)."""
    if state not in STATES[:STATES.index(PROVISIONED)]:
        return f"`preflight lease set {node} {ORDERED} --by you`, then each step to provisioned"
    left = STATES[STATES.index(state) + 1:STATES.index(PROVISIONED) + 1]
    way = " → ".join(STATES[:STATES.index(PROVISIONED) + 1])
    return (f"a lease goes {way}, one step at a time: record "
            + ", then ".join(f"`preflight lease set {node} {s} --by you`" for s in left))


def normalize_node(text: str) -> str:
    """The lease key as typed by a user (``HOST``, ``HOST:PORT``, ``HOST:22``) made canonical."""
    return lease_key(*split_key(text)) if text.strip() else ""


def check_transition(node: str, old: str, new: str) -> None:
    if new == old:
        raise LeaseError(f"the lease of {node} is already {old!r}")
    if new == ENDED:
        return
    i, j = STATES.index(old), STATES.index(new)
    if j < i:
        raise LeaseError(f"the lease of {node} is {old!r}: it does not go back to {new!r}")
    if j > i + 1:
        missing = ", ".join(STATES[i + 1:j])
        raise LeaseError(f"the lease of {node} is {old!r}: record {missing} before {new!r} "
                         "(a payment notice is not a receipt, a receipt is not a ready machine)")


def normalize_time(value: str, what: str) -> str:
    parsed = read_time(value)
    if parsed is None:
        raise LeaseError(f"{what}: {value!r} is not an ISO-8601 time "
                         "(e.g. 2026-03-01T09:00:00+00:00)")
    if parsed.tzinfo is None:
        raise LeaseError(f"{what}: {value!r} has no timezone; add one (e.g. +00:00)")
    return parsed.astimezone(timezone.utc).isoformat(timespec="seconds")


def parse_time(value: str) -> datetime:
    """A recorded time in UTC; ValueError when ``value`` is not one."""
    parsed = read_time(value)
    if parsed is None:
        raise ValueError(f"{value!r} is not an ISO-8601 time")
    return parsed.astimezone(timezone.utc)


def lease_end(lease: dict[str, Any]) -> datetime | None:
    if not lease.get("starts_at") or not lease.get("days"):
        return None
    return parse_time(lease["starts_at"]) + timedelta(days=int(lease["days"]))


@dataclass(frozen=True)
class LeaseAction:
    """What the lease job must do now: ``remind`` (with ``hours``) or ``end``."""

    kind: str
    node: str
    lease_id: int
    end: datetime
    hours: int = 0

    @property
    def key(self) -> str:
        suffix = f"{self.hours}h" if self.kind == "remind" else "end"
        return f"lease:{self.lease_id}:{suffix}"


def due_actions(lease: dict[str, Any], now: datetime) -> list[LeaseAction]:
    """The reminder (only the most urgent one due) or the end, for one lease at ``now``.

    A reminder missed while the bot was down is still sent late, but a 24 h reminder is not
    sent once the 2 h one is due: the closest deadline is the one that matters.
    """
    end = lease_end(lease)
    if end is None or lease["state"] == ENDED:
        return []
    node, lid = str(lease["node"]), int(lease["id"])
    if now >= end:
        return [LeaseAction("end", node, lid, end)]
    due = [h for h in REMINDER_HOURS if now >= end - timedelta(hours=h)]
    if not due:
        return []
    return [LeaseAction("remind", node, lid, end, hours=min(due))]


def unsecured(runs: Sequence[Run]) -> list[str]:
    """What is not yet secured on a node: evidence not verified, decision not taken."""
    out: list[str] = []
    for run in runs:
        if run.status == S.RUNNING:
            out.append(f"{run.id}: still running")
        if run.kind == "pilot" and run.status != S.DISPATCH_FAILED \
                and not (run.evidence is not None and run.evidence.verified):
            out.append(f"{run.id}: evidence not verified")
        if run.status == S.AWAITING_DECISION:
            out.append(f"{run.id}: decision not taken")
    return out
