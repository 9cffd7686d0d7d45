"""Lease rules: one step at a time, who and when, the dispatch guard, the reminder plan."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from bot.errors import LeaseError
from bot.pilot.leases import (
    STATES,
    due_actions,
    lease_end,
    lease_key,
    normalize_node,
    split_key,
    unsecured,
)
from bot.service.leases import check_dispatch, set_state
from bot.store import Run, Store
from tests.bot.manifest_helpers import merged
from tests.bot.runs import run_of

NODE = "gpu-1.example.net"


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "state" / "preflight.db")


def test_states_move_forward_one_step_at_a_time_with_who_and_when(store: Store) -> None:
    lease = set_state(store, NODE, "ordered", "alice", starts_at="2026-03-01T09:00:00+01:00",
                      days=3)
    assert lease["starts_at"] == "2026-03-01T08:00:00+00:00" and lease["days"] == 3
    with pytest.raises(LeaseError, match="record payment-notified, funds-confirmed before"):
        set_state(store, NODE, "provisioned", "alice")
    set_state(store, NODE, "payment-notified", "alice", note="paid by card")
    with pytest.raises(LeaseError, match="does not go back"):
        set_state(store, NODE, "ordered", "bob")
    with pytest.raises(LeaseError, match="already 'payment-notified'"):
        set_state(store, NODE, "payment-notified", "bob")
    set_state(store, NODE, "funds-confirmed", "bob")
    final = set_state(store, NODE, "provisioned", "carol")
    changes = store.lease_changes(final["id"])
    assert [(c["from_state"], c["to_state"], c["by"]) for c in changes] == [
        (None, "ordered", "alice"), ("ordered", "payment-notified", "alice"),
        ("payment-notified", "funds-confirmed", "bob"), ("funds-confirmed", "provisioned", "carol")]
    assert all(c["at"].startswith("20") for c in changes)
    assert changes[1]["note"] == "paid by card"


def test_ended_from_any_state_and_a_new_lease_starts_at_ordered(store: Store) -> None:
    set_state(store, NODE, "ordered", "alice")
    ended = set_state(store, NODE, "ended", "alice", note="order cancelled")
    assert ended["state"] == "ended" and ended["ended_at"]
    with pytest.raises(LeaseError, match="only an ended lease"):
        set_state(store, NODE, "provisioned", "alice")
    again = set_state(store, NODE, "ordered", "bob")
    assert again["id"] != ended["id"] and store.current_lease(NODE)["id"] == again["id"]


@pytest.mark.parametrize("kwargs, message", [
    ({"state": "paid"}, "unknown"),
    ({"by": "  "}, "--by is required"),
    ({"starts_at": "tomorrow"}, "not an ISO-8601 time"),
    ({"starts_at": "2026-03-01T09:00:00"}, "no timezone"),
    ({"days": 0}, "at least 1"),
])
def test_bad_input_is_refused_with_a_clear_message(store: Store, kwargs: dict[str, object],
                                                   message: str) -> None:
    args = {"state": "ordered", "by": "alice", **kwargs}
    with pytest.raises(LeaseError, match=message):
        set_state(store, NODE, args.pop("state"), args.pop("by"), **args)
    assert store.current_lease(NODE) is None


def _run(node: dict, *, kind: str = "pilot", manifest_text: str | None = None,
         **manifest: object) -> Run:
    return run_of(id="r1", node=node, kind=kind, manifest_text=manifest_text,
                  manifest_json=merged(hardware={"days": 7}, **manifest))


def test_guard_lets_local_runs_through_and_refuses_ssh_until_provisioned(store: Store) -> None:
    check_dispatch(store, _run({"kind": "local"}))
    assert store.leases() == []
    ssh = _run({"kind": "ssh", "host": NODE}, lease={"starts_at": "2026-03-01T08:00:00Z"})
    with pytest.raises(LeaseError, match="not provisioned .*'ordered'.*payment-notified") as no:
        check_dispatch(store, ssh)
    # the whole way, not only the next step (issue 37, point 9)
    assert ("a lease goes ordered → payment-notified → funds-confirmed → provisioned, one "
            f"step at a time: record `preflight lease set {NODE} payment-notified --by you`, "
            f"then `preflight lease set {NODE} funds-confirmed --by you`, then "
            f"`preflight lease set {NODE} provisioned --by you`; then `preflight resume r1`"
            ) in str(no.value)
    lease = store.current_lease(NODE)
    assert lease["state"] == "ordered" and lease["created_by"] == "preflight"
    assert (lease["starts_at"], lease["days"]) == ("2026-03-01T08:00:00+00:00", 7)
    for state in STATES[1:4]:
        set_state(store, NODE, state, "alice")
    check_dispatch(store, ssh)
    set_state(store, NODE, "ended", "alice")
    with pytest.raises(LeaseError, match="has ended"):
        check_dispatch(store, ssh)


def test_due_actions_remind_at_24_and_2_hours_and_end_at_expiry() -> None:
    lease = {"id": 1, "node": NODE, "state": "provisioned",
             "starts_at": "2026-03-01T08:00:00+00:00", "days": 3}
    end = lease_end(lease)
    assert end == datetime(2026, 3, 4, 8, tzinfo=timezone.utc)
    assert due_actions(lease, end - timedelta(hours=25)) == []
    [day] = due_actions(lease, end - timedelta(hours=24))
    assert (day.kind, day.hours, day.key) == ("remind", 24, "lease:1:24h")
    [late] = due_actions(lease, end - timedelta(hours=1))  # the 24 h one is superseded
    assert (late.kind, late.hours) == ("remind", 2)
    [over] = due_actions(lease, end)
    assert (over.kind, over.key) == ("end", "lease:1:end")
    assert due_actions({**lease, "state": "ended"}, end) == []
    assert due_actions({**lease, "starts_at": None}, end) == []


def test_unsecured_lists_unverified_evidence_and_pending_decisions() -> None:
    runs = [run_of(id="a", status="awaiting_decision", evidence={"verified": True}),
            run_of(id="b", status="decided", evidence=None),
            run_of(id="c", status="running", evidence=None),
            run_of(id="d", status="dispatch_failed", evidence=None),
            run_of(id="e", kind="volume", status="finished", evidence=None)]
    assert unsecured(runs) == ["a: decision not taken", "b: evidence not verified",
                               "c: still running", "c: evidence not verified"]


def test_two_ports_on_one_host_are_two_leases(store: Store) -> None:
    """Rental markets give many machines one host, told apart by port: never one lease."""
    a = _run({"kind": "ssh", "host": "ssh5.example.net", "port": 41022})
    b = _run({"kind": "ssh", "host": "SSH5.example.net", "port": 41023})
    with pytest.raises(LeaseError, match="node ssh5.example.net:41022 is not provisioned"):
        check_dispatch(store, a)
    for state in STATES[1:4]:
        set_state(store, "ssh5.example.net:41022", state, "alice")
    check_dispatch(store, a)
    with pytest.raises(LeaseError, match="node ssh5.example.net:41023 is not provisioned"):
        check_dispatch(store, b)  # the other port's lease is its own, still 'ordered'
    assert sorted(r["node"] for r in store.leases()) == ["ssh5.example.net:41022",
                                                          "ssh5.example.net:41023"]
    # port 22 is left out of the key, host names are compared in lower case
    set_state(store, "GPU-1.Example.net:22", "ordered", "alice")
    assert store.current_lease("gpu-1.example.net")["state"] == "ordered"
    check = _run({"kind": "ssh", "host": "gpu-1.example.net", "port": 22})
    with pytest.raises(LeaseError, match="'ordered'"):
        check_dispatch(store, check)
    assert len(store.leases()) == 3


@pytest.mark.parametrize("text, key", [
    ("gpu-1", "gpu-1"), ("gpu-1:22", "gpu-1"), ("gpu-1:2222", "gpu-1:2222"),
    ("::1", "::1"), ("[::1]:2222", "[::1]:2222"), ("[::1]:22", "::1")])
def test_lease_keys_are_canonical(text: str, key: str) -> None:
    assert normalize_node(text) == key
    assert lease_key(*split_key(key)) == key


@pytest.mark.parametrize("text", ["gpu-1:x", "gpu-1:0", "gpu-1:70000", "[::1]:ssh"])
def test_a_bad_port_in_a_node_is_refused_naming_it(store: Store, text: str) -> None:
    with pytest.raises(LeaseError, match=r"port after ':' must be a number"):
        set_state(store, text, "ordered", "alice")
    assert store.leases() == []


def test_a_volume_s_other_nodes_need_a_provisioned_lease_named_with_their_line(
        store: Store) -> None:
    from bot.service.leases import lease_guard_for

    text = ("volume:\n  inputs: {dir: c, expected_count: 3}\n  nodes:\n"
            "    - {kind: ssh, host: gpu-1.example.net}\n"
            "    - {kind: ssh, host: gpu-2.example.net}\n"
            "    - {kind: ssh, host: gpu-3.example.net, port: 2222}\n")
    nodes = [{"kind": "ssh", "host": "gpu-1.example.net"},
             {"kind": "ssh", "host": "gpu-2.example.net"},
             {"kind": "ssh", "host": "gpu-3.example.net", "port": 2222}]
    inputs = {"dir": "c", "expected_count": 3}
    run = _run(nodes[0], volume={"inputs": inputs, "nodes": nodes}, kind="volume",
               manifest_text=text)
    for state in STATES[:4]:
        set_state(store, NODE, state, "alice")
    set_state(store, "gpu-3.example.net:2222", "ordered", "bob")
    guard = lease_guard_for(store)
    with pytest.raises(LeaseError) as refused:
        guard(run)
    message = str(refused.value)
    assert "volume.nodes[1] (line 5): node gpu-2.example.net has no lease" in message
    assert "volume.nodes[2] (line 6): node gpu-3.example.net:2222 is not provisioned " \
           "(its lease is 'ordered')" in message
    assert store.current_lease("gpu-2.example.net") is None  # nothing recorded for it
    for state in STATES[:4]:
        set_state(store, "gpu-2.example.net", state, "alice")
    for state in STATES[1:4]:
        set_state(store, "gpu-3.example.net:2222", state, "bob")
    guard(run)
    guard(_run(nodes[0], volume={"inputs": inputs, "nodes": nodes[:1] + [{}]}))
