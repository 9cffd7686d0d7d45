"""Leases of rented nodes.

A lease is one rental of one node (``node`` is the node's key: ``host``, or ``host:port``
when the port is not 22, see ``bot.pilot.leases.lease_key``); its state only moves forward
and every change is kept in ``lease_changes`` with who and when.
"""

from __future__ import annotations

import json
from typing import Any

import sqlite_utils

from bot.manifest.nodes import remote_kinds
from bot.pilot.leases import ENDED
from bot.pilot.record import Run
from bot.store.base import StoreBase
from bot.store.runs import RUN_SELECT, decode_row
from runner.events import utc_now


def migrate_leases(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS leases (
        id INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, state TEXT NOT NULL,
        starts_at TEXT, days INTEGER, created_at TEXT NOT NULL, created_by TEXT NOT NULL,
        updated_at TEXT NOT NULL, ended_at TEXT)""")
    db.execute("CREATE INDEX IF NOT EXISTS leases_by_node ON leases(node, id)")
    db.execute("""CREATE TABLE IF NOT EXISTS lease_changes (
        id INTEGER PRIMARY KEY AUTOINCREMENT, lease INTEGER NOT NULL REFERENCES leases(id),
        from_state TEXT, to_state TEXT NOT NULL, by TEXT NOT NULL, at TEXT NOT NULL,
        note TEXT)""")


# A node object ``{v}`` (a JSON column or value) that is the remote node host:port (three
# parameters: the remote kinds as a JSON list, ``on_node_params``; the host in lower case,
# as lease keys are; the port). Which kinds are remote is their models' to say.
ON_NODE = ("json_extract({v}, '$.kind') IN (SELECT value FROM json_each(?)) "
           "AND lower(json_extract({v}, '$.host')) = ? "
           "AND COALESCE(json_extract({v}, '$.port'), 22) = ?")


def on_node_params(host: str, port: int) -> list[Any]:
    """``ON_NODE``'s parameters for the node ``host:port``."""
    return [json.dumps(remote_kinds()), host.lower(), int(port)]


class LeasesMixin(StoreBase):

    # -- leases -------------------------------------------------------------------
    def current_lease(self, node: str) -> dict[str, Any] | None:
        rows = list(self.db.query(
            "SELECT * FROM leases WHERE node = ? ORDER BY id DESC LIMIT 1", [node]))
        return rows[0] if rows else None

    def leases(self, *, include_ended: bool = True) -> list[dict[str, Any]]:
        """The latest lease of every node."""
        rows = self.db.query(
            "SELECT * FROM leases WHERE id IN (SELECT MAX(id) FROM leases GROUP BY node) "
            "ORDER BY node")
        return [r for r in rows if include_ended or r["state"] != ENDED]

    def open_lease(self, node: str, state: str, by: str, *, starts_at: str | None = None,
                   days: int | None = None, note: str | None = None) -> dict[str, Any]:
        """Record a new lease of ``node`` (the previous one, if any, must be ended)."""
        now = utc_now()
        with self.transaction() as db:
            table = db.table("leases")
            table.insert({"node": node, "state": state, "starts_at": starts_at, "days": days,
                          "created_at": now, "created_by": by, "updated_at": now,
                          "ended_at": now if state == ENDED else None})
            lease_id = int(table.last_pk)  # type: ignore[arg-type]  # set by the insert
            db.table("lease_changes").insert({"lease": lease_id, "from_state": None,
                                              "to_state": state, "by": by, "at": now,
                                              "note": note})
        return self.lease(lease_id)

    def lease(self, lease_id: int) -> dict[str, Any]:
        return next(self.db.query("SELECT * FROM leases WHERE id = ?", [lease_id]))

    def change_lease(self, lease_id: int, from_state: str, to_state: str, by: str, *,
                     note: str | None = None) -> bool:
        """Conditional state change with its history row; False if the state moved meanwhile."""
        now = utc_now()
        with self.transaction() as db:
            cur = db.execute(
                "UPDATE leases SET state = ?, updated_at = ?, "
                "ended_at = CASE WHEN ? = 'ended' THEN ? ELSE ended_at END "
                "WHERE id = ? AND state = ?", [to_state, now, to_state, now, lease_id, from_state])
            if cur.rowcount != 1:
                return False
            db.table("lease_changes").insert({"lease": lease_id, "from_state": from_state,
                                              "to_state": to_state, "by": by, "at": now,
                                              "note": note})
        return True

    def set_lease_terms(self, lease_id: int, *, starts_at: str | None = None,
                        days: int | None = None) -> None:
        fields = {k: v for k, v in (("starts_at", starts_at), ("days", days)) if v is not None}
        if fields:
            with self.transaction() as db:
                db.table("leases").update(lease_id, {**fields, "updated_at": utc_now()})

    def lease_changes(self, lease_id: int) -> list[dict[str, Any]]:
        return list(self.db.query(
            "SELECT * FROM lease_changes WHERE lease = ? ORDER BY id", [lease_id]))

    def runs_on_node(self, host: str, port: int = 22, *,
                     since: str | None = None) -> list[Run]:
        """Runs whose SSH node is ``host:port`` (oldest first), optionally created since.

        The host is compared in lower case, as lease keys are (``bot.leases.lease_key``).
        """
        return self._runs_on(host, port, "created_at >= ?", since or "")

    def runs_waiting_on_node(self, host: str, port: int = 22) -> list[Run]:
        """Runs on SSH node ``host:port`` not started yet (their dispatch waits on the lease)."""
        return self._runs_on(host, port,
                             "status IN ('planned', 'dispatching', 'dispatch_failed')")

    def _runs_on(self, host: str, port: int, cond: str, *params: str) -> list[Run]:
        """The runs whose own node is ``host:port`` and that meet ``cond``, oldest first."""
        rows = self.db.query(
            f"SELECT {RUN_SELECT} FROM runs WHERE {ON_NODE.format(v='node')} AND {cond} "
            "ORDER BY id", [*on_node_params(host, port), *params])
        return [Run.from_row(decode_row(r)) for r in rows]

    def running_on_node(self, host: str, port: int = 22) -> list[str]:
        """Ids of the running runs that use ``host:port``: as their node, or as one of
        their volume's nodes (a several-node volume's workers)."""
        rows = self.db.query(
            "SELECT id FROM runs WHERE status = 'running' AND ((" + ON_NODE.format(v="node")
            + ") OR EXISTS (SELECT 1 FROM json_each(runs.manifest_json, '$.volume.nodes') AS n "
            "WHERE json_type(n.value) = 'object' AND " + ON_NODE.format(v="n.value") + ")) "
            "ORDER BY id", [*on_node_params(host, port), *on_node_params(host, port)])
        return [r["id"] for r in rows]

