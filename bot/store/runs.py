"""Runs: their rows, their states' moves (``transition``), finding one by a prefix, and where
a transport put each of their messages. Their events, stages and items are ``events.py``'s,
their decisions ``decisions.py``'s."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterable
from typing import Any

import sqlite_utils

from bot.errors import RunNotFound, StoreError, VolumeExists
from bot.pilot.record import RUN_COLUMNS
from bot.pilot.states import RunStatus, allowed_sources
from bot.store.base import StoreBase
from bot.store.expected import run_key, write_ids
from bot.store.items import (
    migrate_items,
)
from bot.store.record import COLUMNS, Run, RunRecord
from runner.events import (
    utc_now,
)

JSON_COLUMNS = frozenset({
    "first_error", "verdict", "balance", "evidence", "environment", "plan", "manifest_json",
    "node", "facts", "error", "data", "changes", "expected_refusals",
    "categories", "success", "approvers", "forecast", "stop",
})

RUN_SELECT = ", ".join(RUN_COLUMNS)



def migrate_runs(db: sqlite_utils.Database) -> None:
    db.execute("""CREATE TABLE IF NOT EXISTS runs (
        id TEXT PRIMARY KEY, name TEXT NOT NULL, attempt INTEGER NOT NULL,
        kind TEXT NOT NULL DEFAULT 'pilot', parent_run TEXT, status TEXT NOT NULL,
        outcome TEXT, stage_reached TEXT, first_error TEXT, verdict TEXT, balance TEXT,
        evidence TEXT, environment TEXT, plan TEXT, changes TEXT, manifest_text TEXT,
        manifest_json TEXT, spec_path TEXT, run_dir TEXT NOT NULL, node TEXT,
        submitter TEXT, channel TEXT, thread_ts TEXT, created_at TEXT NOT NULL,
        started_at TEXT, finished_at TEXT, last_seq INTEGER NOT NULL DEFAULT 0,
        events_offset INTEGER NOT NULL DEFAULT 0, last_event_at TEXT, pid INTEGER,
        expected_refusals TEXT, categories TEXT, success TEXT,
        approvers TEXT, two_person INTEGER NOT NULL DEFAULT 0, exit_code INTEGER,
        base_dir TEXT, project_dir TEXT, resume_seq INTEGER NOT NULL DEFAULT 0,
        UNIQUE (name, attempt, kind))""")
    if "resume_seq" not in db["runs"].columns_dict:  # a database made before resumes
        db.execute("ALTER TABLE runs ADD COLUMN resume_seq INTEGER NOT NULL DEFAULT 0")
    if "stop" not in db["runs"].columns_dict:  # who stopped the run, when and why (JSON)
        db.execute("ALTER TABLE runs ADD COLUMN stop TEXT")
    # One approval launches at most one volume, whatever the path: the database refuses a
    # second volume run of the same pilot (two approvers at once, a retried request, ...).
    db.execute("CREATE UNIQUE INDEX IF NOT EXISTS one_volume_per_pilot ON runs(parent_run) "
               "WHERE kind = 'volume'")
    if "forecast" not in db["runs"].columns_dict:  # the volume forecast (or its check)
        db.execute("ALTER TABLE runs ADD COLUMN forecast TEXT")
    db.execute("""CREATE TABLE IF NOT EXISTS events (
        run TEXT NOT NULL REFERENCES runs(id), seq INTEGER NOT NULL, type TEXT NOT NULL,
        ts TEXT NOT NULL, stage TEXT, data TEXT NOT NULL, PRIMARY KEY (run, seq))""")
    # The follower asks for a run's events of one type (stage, progress, volume notes) at
    # every poll: without this index each ask reads every item event of the run again.
    db.execute("CREATE INDEX IF NOT EXISTS events_by_type ON events(run, type, seq)")
    db.execute("""CREATE TABLE IF NOT EXISTS stages (
        run TEXT NOT NULL REFERENCES runs(id), stage TEXT NOT NULL, state TEXT NOT NULL,
        facts TEXT, error TEXT, reason TEXT, started_at TEXT, ended_at TEXT,
        PRIMARY KEY (run, stage))""")
    migrate_items(db)  # item events live only in items (items.py)
    db.execute("""CREATE TABLE IF NOT EXISTS decisions (
        id INTEGER PRIMARY KEY AUTOINCREMENT, run TEXT NOT NULL REFERENCES runs(id),
        decision TEXT NOT NULL, reason TEXT NOT NULL, by TEXT NOT NULL, at TEXT NOT NULL,
        override INTEGER NOT NULL DEFAULT 0, accepted INTEGER NOT NULL,
        refusal TEXT, source TEXT)""")
    if "override_of" not in db["decisions"].columns_dict:  # what an override overrode
        db.execute("ALTER TABLE decisions ADD COLUMN override_of TEXT")
    db.execute("""CREATE TABLE IF NOT EXISTS message_refs (
        run TEXT NOT NULL, key TEXT NOT NULL, transport TEXT NOT NULL, channel TEXT,
        ref TEXT NOT NULL, updated_at TEXT NOT NULL, PRIMARY KEY (run, key, transport))""")


def _encode(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v, sort_keys=True, default=str) if k in JSON_COLUMNS and v is not None
                else v) for k, v in fields.items()}


def decode_row(row: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.loads(v) if k in JSON_COLUMNS and isinstance(v, str) else v)
            for k, v in row.items()}


class RunsMixin(StoreBase):
    """The runs table: a run's row, its states' moves, finding it."""

    # -- runs ---------------------------------------------------------------------
    def create_run(self, record: dict[str, Any]) -> None:
        """Insert a new run; a second volume run of one pilot raises VolumeExists. Its
        ``expected_ids`` (any iterable) go to their own table (bot/store/expected.py), in
        the same transaction."""
        record = {"created_at": utc_now(), "status": str(RunStatus.PLANNED), **record}
        ids = record.pop("expected_ids", None)
        with self.transaction() as db:
            try:
                db.table("runs").insert(_encode(record))
            except sqlite3.IntegrityError as exc:
                existing = self.volume_of(str(record.get("parent_run")))
                if record.get("kind") == "volume" and existing is not None:
                    raise VolumeExists(str(record["parent_run"]), existing) from exc
                raise
            if ids is not None:
                write_ids(db, run_key(db, str(record["id"])), ids)

    def volume_of(self, pilot_id: str) -> str | None:
        """The id of the volume run a pilot's approval launched, if any."""
        rows = list(self.db.query("SELECT id FROM runs WHERE parent_run = ? AND kind = 'volume'",
                                  [pilot_id]))
        return str(rows[0]["id"]) if rows else None

    def get_run(self, run_id: str) -> dict[str, Any]:
        rows = list(self.db.query("SELECT * FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise RunNotFound(run_id)
        return decode_row(rows[0])

    def run_head(self, run_id: str) -> dict[str, Any]:
        """What a follower needs on every poll (state, position, where the runner is),
        without decoding the large JSON columns (the expected ids of a 20,000-item run)."""
        rows = list(self.db.query(
            "SELECT id, kind, status, node, run_dir, spec_path, project_dir, pid, "
            "events_offset, last_seq, resume_seq FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise RunNotFound(run_id)
        return decode_row(rows[0])

    def run_record(self, run_id: str) -> RunRecord:
        """The run's typed record (bot.store.record): its identity, state, where it runs and
        how far its events were read, without the large JSON columns."""
        rows = list(self.db.query(f"SELECT {', '.join(COLUMNS)} FROM runs WHERE id = ?",
                                  [run_id]))
        if not rows:
            raise RunNotFound(run_id)
        return RunRecord.from_row(decode_row(rows[0]))

    def run(self, run_id: str) -> Run:
        """The run, typed (bot.pilot.record.Run): its plan, its manifest checked once, its
        verdict, balance, forecast..., without the expected ids (``expected_ids``)."""
        rows = list(self.db.query(f"SELECT {RUN_SELECT} FROM runs WHERE id = ?", [run_id]))
        if not rows:
            raise RunNotFound(run_id)
        return Run.from_row(decode_row(rows[0]))

    def find(self, prefix: str) -> Run:
        """``find_run``'s run, typed."""
        return self.run(str(self.find_run(prefix)["id"]))

    def runs(self, *, limit: int = 50, status: str | None = None,
             channel: str | None = None) -> list[Run]:
        """``list_runs``'s runs, typed (the newest first)."""
        conds = [c for c, v in (("status = ?", status), ("channel = ?", channel)) if v]
        params = [v for v in (status, channel) if v]
        where = f"WHERE {' AND '.join(conds)}" if conds else ""
        sql = f"SELECT {RUN_SELECT} FROM runs {where} ORDER BY id DESC LIMIT ?"
        return [Run.from_row(decode_row(r)) for r in self.db.query(sql, [*params, limit])]

    def running(self) -> list[Run]:
        """``active_runs``, typed: the runs whose runner is running, oldest first."""
        return [Run.from_row(decode_row(r)) for r in self.db.query(
            f"SELECT {RUN_SELECT} FROM runs WHERE status = ? ORDER BY id",
            [str(RunStatus.RUNNING)])]

    def find_run(self, prefix: str) -> dict[str, Any]:
        """A run by what a person types: its id or a unique id prefix, ``latest`` (the
        newest run), or a pilot's name (its newest run). Unknown: did-you-mean."""
        if prefix == "latest":
            newest = list(self.db.query("SELECT id FROM runs ORDER BY id DESC LIMIT 1"))
            if not newest:
                raise RunNotFound(prefix, "there are no runs yet")
            return self.get_run(newest[0]["id"])
        by_name = list(self.db.query(
            "SELECT id FROM runs WHERE name = ? ORDER BY id DESC LIMIT 1", [prefix]))
        if by_name:
            return self.get_run(by_name[0]["id"])
        rows = list(self.db.query("SELECT id FROM runs WHERE id = ? OR id LIKE ? ESCAPE '\\'",
                                  [prefix, prefix.replace("%", "\\%").replace("_", "\\_") + "%"]))
        exact = [r for r in rows if r["id"] == prefix]
        if exact or len(rows) == 1:
            return self.get_run((exact or rows)[0]["id"])
        error = RunNotFound(prefix, self._did_you_mean(prefix))
        if rows:
            ids = sorted(r["id"] for r in rows)
            error.args = (f"{prefix!r} matches {len(ids)} runs ({', '.join(ids[:5])}"
                          f"{', …' if len(ids) > 5 else ''}): give more of the run id",)
        raise error

    def _did_you_mean(self, typed: str) -> str | None:
        import difflib

        known = [(str(r["id"]), str(r["name"])) for r in self.db.query(
            "SELECT id, name FROM runs ORDER BY id DESC LIMIT 500")]
        names = list(dict.fromkeys(n for _, n in known))
        close = difflib.get_close_matches(typed, names, n=3, cutoff=0.6) or \
            difflib.get_close_matches(typed, [i for i, _ in known], n=3, cutoff=0.6)
        return f"did you mean {' or '.join(close)}?" if close else None

    def list_runs(self, *, limit: int = 50, status: str | None = None,
                  channel: str | None = None) -> list[dict[str, Any]]:
        """The newest runs; ``status``, ``channel``: only those (a channel's own runs)."""
        conds = [c for c, v in (("status = ?", status), ("channel = ?", channel)) if v]
        params = [v for v in (status, channel) if v]
        where = f"WHERE {' AND '.join(conds)}" if conds else ""
        sql = f"SELECT * FROM runs {where} ORDER BY id DESC LIMIT ?"
        return [decode_row(r) for r in self.db.query(sql, [*params, limit])]

    def active_runs(self) -> list[dict[str, Any]]:
        return [decode_row(r) for r in self.db.query(
            "SELECT * FROM runs WHERE status = ? ORDER BY id", [str(RunStatus.RUNNING)])]

    def next_attempt(self, name: str, kind: str = "pilot") -> int:
        row = next(self.db.query(
            "SELECT COALESCE(MAX(attempt), 0) AS n FROM runs WHERE name = ? AND kind = ?",
            [name, kind]))
        return int(row["n"]) + 1

    def previous_attempt(self, name: str, before: str) -> Run | None:
        """The pilot's attempt before ``before``, typed (None for a first attempt)."""
        rows = list(self.db.query(
            f"SELECT {RUN_SELECT} FROM runs WHERE name = ? AND kind = 'pilot' AND id < ? "
            "ORDER BY id DESC LIMIT 1", [name, before]))
        return Run.from_row(decode_row(rows[0])) if rows else None

    def update_run(self, run_id: str, **fields: Any) -> None:
        """Change a run's fields; its status changes only through ``transition``."""
        if "status" in fields:
            raise StoreError(f"run {run_id}: a status changes through transition() only")
        if "expected_ids" in fields:
            raise StoreError(f"run {run_id}: its expected ids change through "
                             "set_expected_ids() only (a table of their own)")
        with self.transaction() as db:
            db.table("runs").update(run_id, _encode(fields))

    def transition(self, run_id: str, from_states: Iterable[str], to_state: str,
                   **fields: Any) -> bool:
        """Conditional state change; False when the run was not in one of ``from_states``.

        This is what makes a double click or a duplicated request harmless. Only the changes
        that ``bot.pilot.states.TRANSITIONS`` lists are made: from any other state, nothing
        changes and the answer is False, as for a run that is no longer in ``from_states``.
        """
        states = allowed_sources(from_states, to_state)
        if not states:
            return False
        values = _encode({"status": str(RunStatus(to_state)), **fields})
        sets = ", ".join(f"{k} = ?" for k in values)
        marks = ", ".join("?" for _ in states)
        with self.transaction() as db:
            cur = db.execute(f"UPDATE runs SET {sets} WHERE id = ? AND status IN ({marks})",
                             [*values.values(), run_id, *states])
            return bool(cur.rowcount == 1)

    # -- where a transport put each message (Slack ts, ...) ------------------------
    def set_message_ref(self, run_id: str, key: str, transport: str, ref: str,
                        channel: str | None = None) -> None:
        with self.transaction() as db:
            db.table("message_refs").upsert(
                {"run": run_id, "key": key, "transport": transport, "ref": ref,
                 "channel": channel, "updated_at": utc_now()}, pk=("run", "key", "transport"))

    def message_ref(self, run_id: str, key: str, transport: str) -> dict[str, Any] | None:
        rows = list(self.db.query(
            "SELECT * FROM message_refs WHERE run = ? AND key = ? AND transport = ?",
            [run_id, key, transport]))
        return rows[0] if rows else None
