"""Lease records: a state change applied, and a dispatch checked, on the store.

The rules (states, transitions, node keys, the reminder plan) are ``bot.pilot.leases``;
this module applies them to the lease records: ``set_state`` (a transport's change, through
``PilotService.change_lease``) and the ``lease_guard`` the service calls before a dispatch,
which records a node seen for the first time as ``ordered``.
"""

from __future__ import annotations

from typing import Any, Protocol

from bot.errors import LeaseError
from bot.manifest.source import SourceError, parse_text
from bot.pilot.leases import (
    ENDED,
    ORDERED,
    PROVISIONED,
    STATES,
    SYSTEM,
    check_transition,
    node_key,
    normalize_node,
    normalize_time,
    steps_to_provisioned,
)
from bot.pilot.record import Run


class LeaseStore(Protocol):
    def current_lease(self, node: str) -> dict[str, Any] | None: ...
    def open_lease(self, node: str, state: str, by: str, *, starts_at: str | None = None,
                   days: int | None = None, note: str | None = None) -> dict[str, Any]: ...
    def lease(self, lease_id: int) -> dict[str, Any]: ...
    def change_lease(self, lease_id: int, from_state: str, to_state: str, by: str, *,
                     note: str | None = None) -> bool: ...
    def set_lease_terms(self, lease_id: int, *, starts_at: str | None = None,
                        days: int | None = None) -> None: ...


def set_state(store: LeaseStore, node: str, state: str, by: str, *,
              starts_at: str | None = None, days: int | None = None,
              note: str | None = None) -> dict[str, Any]:
    """Apply one lease state change with its rules; return the lease as it now stands."""
    node, by = normalize_node(node), by.strip()
    if not node:
        raise LeaseError("lease: the node (HOST, or HOST:PORT when the port is not 22) "
                         "is required")
    if not by:
        raise LeaseError("lease: --by is required: every change records who made it")
    if state not in STATES:
        raise LeaseError(f"lease state {state!r} is unknown; expected one of: {', '.join(STATES)}")
    starts_at = normalize_time(starts_at, "--starts-at") if starts_at else None
    if days is not None and days < 1:
        raise LeaseError(f"lease --days must be at least 1, got {days}")
    current = store.current_lease(node)
    if current is None or current["state"] == ENDED:
        if state != ORDERED:
            have = "no lease" if current is None else "only an ended lease"
            raise LeaseError(f"node {node} has {have}: a new lease starts at 'ordered' "
                             f"(`preflight lease set {node} ordered --by you`)")
        return store.open_lease(node, state, by, starts_at=starts_at, days=days, note=note)
    check_transition(node, current["state"], state)
    if not store.change_lease(int(current["id"]), current["state"], state, by, note=note):
        raise LeaseError(f"the lease of {node} changed meanwhile; look at it again "
                         f"(`preflight lease show {node}`)")
    store.set_lease_terms(int(current["id"]), starts_at=starts_at, days=days)
    return store.lease(int(current["id"]))


def lease_guard_for(store: LeaseStore) -> Any:
    """The ``lease_guard`` the service calls before a dispatch (raises LeaseError)."""

    def guard(run: Run) -> None:
        check_dispatch(store, run)
        check_volume_leases(store, run)

    return guard


def check_dispatch(store: LeaseStore, run: Run) -> None:
    """Refuse a dispatch to an SSH node whose lease is not ``provisioned``.

    A node seen for the first time gets a lease record in state ``ordered`` (so reminders
    can follow it), with the manifest's ``lease.starts_at`` and ``hardware.days``.
    """
    node = node_key(run.node)
    if node is None:
        return
    starts_at, days = _terms(run)
    lease = store.current_lease(node)
    if lease is None:
        lease = store.open_lease(node, ORDERED, SYSTEM, starts_at=starts_at, days=days,
                                 note=f"first seen with run {run.id}")
    elif lease["state"] != ENDED:  # fill in terms the lease does not have yet
        store.set_lease_terms(int(lease["id"]),
                              starts_at=None if lease.get("starts_at") else starts_at,
                              days=None if lease.get("days") else days)
    if lease["state"] != PROVISIONED:
        raise LeaseError(
            f"run {run.id}: node {node} is not provisioned (its lease is "
            f"{lease['state']!r}); nothing is dispatched to it until it is: "
            f"{steps_to_provisioned(node, lease['state'])}; then `preflight resume {run.id}`"
            if lease["state"] != ENDED else
            f"run {run.id}: the lease of node {node} has ended; record a new one "
            f"(`preflight lease set {node} ordered --by you`)")


def _terms(run: Run) -> tuple[str | None, int | None]:
    if run.manifest is None:  # none recorded, or it no longer validates: no terms known
        return None, None
    starts = run.manifest.lease.starts_at
    return (normalize_time(starts.isoformat(), "lease.starts_at") if starts else None,
            run.manifest.hardware.days)


def check_volume_leases(store: LeaseStore, run: Run) -> None:
    """Refuse a volume run while one of its other SSH nodes has no provisioned lease."""
    if run.kind != "volume":
        return
    nodes = run.volume_nodes
    if not isinstance(nodes, list):
        return
    problems = []
    for index, node in enumerate(nodes[1:], start=1):
        key = node_key(node.model_dump(mode="json"))
        if key is None:
            continue
        lease = store.current_lease(key)
        where = f"volume.nodes[{index}]{_volume_line(run, index)}"
        if lease is None or lease["state"] == "ended":
            problems.append(f"{where}: node {key} has no lease: record it first "
                            f"(`preflight lease set {key} ordered --by you`, then up to "
                            "provisioned)")
        elif lease["state"] != "provisioned":
            problems.append(f"{where}: node {key} is not provisioned (its lease is "
                            f"{lease['state']!r}); nothing runs on it until it is: "
                            f"{steps_to_provisioned(key, lease['state'])}")
    if problems:
        raise LeaseError(f"run {run.id}: " + "; ".join(problems))


def _volume_line(run: Run, index: int) -> str:
    try:
        _data, source = parse_text(run.manifest_text or "")
    except SourceError:
        return ""
    line, _col = source.locate(("volume", "nodes", index))
    return f" (line {line})" if line else ""
