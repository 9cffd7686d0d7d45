"""``RunRecord``: a run as the store holds it, typed and checked once where it leaves the
store, then trusted (no string keys read back five layers down).

It carries the run's identity, state, where it runs and how far its events were read: what
the service's follower and the dispatchers' handles need at every look. It leaves out the
large JSON columns (the manifest, the plan, the expected ids of a 20,000-item run, the
verdict, the balance), which ``Store.get_run`` still returns as a dict to the readers not
yet typed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from bot.errors import StoreError

# The columns a RunRecord is read from (Store.run_record selects only these).
COLUMNS = ("id", "name", "attempt", "kind", "status", "parent_run", "outcome", "stage_reached",
           "spec_path", "run_dir", "node", "submitter", "channel", "thread_ts", "created_at",
           "started_at", "finished_at", "last_seq", "events_offset", "last_event_at", "pid",
           "exit_code", "base_dir", "project_dir", "resume_seq")


@dataclass(frozen=True)
class RunRecord:
    id: str
    name: str
    attempt: int
    kind: str  # "pilot" or "volume"
    status: str  # bot.pilot.states.S
    run_dir: Path
    created_at: str
    spec_path: Path | None = None
    project_dir: Path | None = None
    base_dir: Path | None = None
    node: dict[str, Any] | None = None  # the manifest's node (or the volume's head)
    pid: int | None = None
    parent_run: str | None = None
    outcome: str | None = None
    stage_reached: str | None = None
    submitter: str | None = None
    channel: str | None = None
    thread_ts: str | None = None
    started_at: str | None = None
    finished_at: str | None = None
    last_event_at: str | None = None
    exit_code: int | None = None
    last_seq: int = 0
    events_offset: int = 0
    resume_seq: int = 0

    @property
    def node_kind(self) -> str:
        """The kind of node the run runs on (``local`` when the manifest named none)."""
        return str((self.node or {}).get("kind", "local"))

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRecord:
        """The record of a decoded ``runs`` row (its other columns ignored); StoreError
        naming the run and the column when one does not hold what it should."""
        run = str(row.get("id", "?"))
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = row.get(f.name)
            if value is None:
                continue
            kind = str(f.type)
            if "Path" in kind:
                value = _checked(run, f.name, value, str, Path)
            elif kind.startswith("int"):
                value = _checked(run, f.name, value, int, int)
            elif kind.startswith("dict"):
                value = _checked(run, f.name, value, dict, dict)
            else:
                value = _checked(run, f.name, value, str, str)
            values[f.name] = value
        missing = [name for name in ("id", "name", "attempt", "kind", "status", "run_dir",
                                     "created_at") if name not in values]
        if missing:
            raise StoreError(f"run {run}: the state database's row has no "
                             f"{', '.join(missing)}; is it a Preflight state database?")
        return cls(**values)


def _checked(run: str, column: str, value: Any, stored: type, make: Any) -> Any:
    if not isinstance(value, stored) or (stored is int and isinstance(value, bool)):
        raise StoreError(f"run {run}: column {column} holds {type(value).__name__} "
                         f"{value!r}, not {stored.__name__}: the state database was changed "
                         "by hand or by another program")
    return make(value)
