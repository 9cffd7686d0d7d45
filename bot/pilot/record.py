"""A run as the store holds it, typed and checked once where it leaves the store, then
trusted (no string keys read back five layers down).

``RunRecord`` carries the run's identity, state, where it runs and how far its events were
read: what the service's follower and the dispatchers' handles need at every look
(``Store.run_record``, none of the JSON columns decoded). ``Run`` is a ``RunRecord`` with
the parts its readers read from the JSON columns (``Store.run``, ``find``, ``runs``,
``running``): the plan as a ``Plan``, the manifest as the checked ``Manifest`` (validated
once, here), the verdict, balance, forecast, evidence, the stop, approvers, the success
criteria. It leaves out the expected ids (the 20,000-item list of a volume run): a reader
that needs them asks the store (``Store.expected_ids``).

The types live here, in the pure layer, so that every layer (the transports included) can
name them; only the store builds them from rows. ``Store.get_run`` still returns the raw
decoded row (a dict), for tests and tools that look at the database itself.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bot.errors import StoreError
from bot.manifest.model import Manifest
from bot.manifest.nodes import DEFAULT_NODE_KIND, is_remote_node
from bot.pilot.payloads import (
    Balance,
    Evidence,
    StopNote,
    StoredForecast,
    Verdict,
    VerdictCheck,
)
from bot.pilot.plan import Plan

__all__ = ["COLUMNS", "RUN_COLUMNS", "Balance", "Evidence", "Run", "RunRecord", "StopNote",
           "StoredForecast", "Verdict", "VerdictCheck"]

# The columns a RunRecord is read from (Store.run_record selects only these).
COLUMNS = ("id", "name", "attempt", "kind", "status", "parent_run", "outcome", "stage_reached",
           "spec_path", "run_dir", "node", "submitter", "channel", "thread_ts", "created_at",
           "started_at", "finished_at", "last_seq", "events_offset", "last_event_at", "pid",
           "exit_code", "base_dir", "project_dir", "resume_seq", "items_pruned_at")


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
    # when retention pruned its item rows, expected ids and progress (bot/store/retention.py)
    items_pruned_at: str | None = None

    @property
    def node_kind(self) -> str:
        """The kind of node the run runs on (``local`` when the manifest named none)."""
        return str((self.node or {}).get("kind", DEFAULT_NODE_KIND))

    @property
    def remote(self) -> bool:
        """Whether the run's node is another machine than the bot host (its kind's
        ``is_remote``; False for a kind that is not one)."""
        return is_remote_node(self.node or {})

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> RunRecord:
        """The record of a decoded ``runs`` row (its other columns ignored); StoreError
        naming the run and the column when one does not hold what it should."""
        return cls(**_base_values(row))


def _base_values(row: Mapping[str, Any]) -> dict[str, Any]:
    """The RunRecord fields of a decoded row, checked."""
    run = str(row.get("id", "?"))
    values: dict[str, Any] = {}
    for f in fields(RunRecord):
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
    return values


# The JSON columns a Run reads that hold an object (a dict), and those that hold a list.
OBJECT_COLUMNS = ("verdict", "balance", "forecast", "evidence", "environment", "first_error",
                  "stop", "success")
LIST_COLUMNS = ("changes", "approvers", "categories", "expected_refusals")
# The columns a Run is read from: all but the expected ids (Store.expected_ids asks for them).
RUN_COLUMNS = (*COLUMNS, "plan", "manifest_json", "manifest_text", "two_person",
               *OBJECT_COLUMNS, *LIST_COLUMNS)


@dataclass(frozen=True)
class Run(RunRecord):
    """A run with what its readers read from the JSON columns, checked once here.

    ``plan``: None for a run recorded without one (a test's bare row). ``manifest``: the
    stored manifest validated again by today's ``Manifest``; None when the run has none or
    it no longer validates (a field since renamed), and then ``manifest_problem`` says why:
    an old run is still shown, followed and decided, without the manifest's details.
    The payloads (verdict, balance, forecast, evidence, stop) are typed once here
    (``bot.pilot.payloads``); the other objects are the JSON the pilot's rules wrote."""

    plan: Plan | None = None
    manifest: Manifest | None = None
    manifest_problem: str | None = None
    manifest_text: str | None = None
    two_person: bool = False
    verdict: Verdict | None = None
    balance: Balance | None = None
    forecast: StoredForecast | None = None
    evidence: Evidence | None = None
    environment: dict[str, Any] | None = None
    first_error: dict[str, Any] | None = None
    stop: StopNote | None = None
    success: dict[str, Any] | None = None
    changes: tuple[dict[str, Any], ...] = ()
    approvers: tuple[str, ...] = ()
    categories: tuple[str, ...] = ()
    expected_refusals: tuple[str, ...] = ()
    # Joined by the service from other tables where a reader needs them (never a column):
    decision: dict[str, Any] | None = None  # the accepted decision
    volume_run: str | None = None  # the volume run the pilot's approval launched

    @property
    def manifest_json(self) -> dict[str, Any]:
        """The manifest as JSON (what a diff compares); {} without a valid manifest."""
        return self.manifest.model_dump(mode="json") if self.manifest is not None else {}

    @property
    def volume_nodes(self) -> Any:
        """The manifest's ``volume.nodes`` (a list of nodes, a count or None)."""
        volume = self.manifest.volume if self.manifest is not None else None
        return volume.nodes if volume is not None else None

    def joined(self, **joined: Any) -> Run:
        """The same run with what the service joined to it (``decision``, ``volume_run``)."""
        return replace(self, **joined)

    @classmethod
    def from_row(cls, row: Mapping[str, Any]) -> Run:
        """The run of a decoded ``runs`` row; StoreError naming the run and the column when
        one does not hold what it should (a manifest that no longer validates is not one:
        see ``manifest_problem``)."""
        values: dict[str, Any] = _base_values(row)
        run = values["id"]
        for column in OBJECT_COLUMNS:
            if row.get(column) is not None:
                values[column] = _checked(run, column, row[column], dict, dict)
        for column in LIST_COLUMNS:
            if row.get(column) is not None:
                values[column] = tuple(_checked(run, column, row[column], list, list))
        if row.get("manifest_text") is not None:
            values["manifest_text"] = _checked(run, "manifest_text", row["manifest_text"],
                                               str, str)
        values["verdict"] = Verdict.from_stored(values["verdict"]) \
            if values.get("verdict") else None
        if values.get("stop") is not None:
            values["stop"] = StopNote.from_stored(run, values["stop"])
        for column, parse in (("balance", Balance.from_stored),
                              ("evidence", Evidence.from_stored),
                              ("forecast", StoredForecast.from_stored)):
            # an empty object, as a run that never had one (what the readers always did)
            values[column] = parse(run, values[column]) if values.get(column) else None
        values["two_person"] = bool(row.get("two_person"))
        if row.get("plan") is not None:
            plan = _checked(run, "plan", row["plan"], dict, dict)
            try:
                values["plan"] = Plan.from_dict(plan)
            except (KeyError, ValueError, TypeError, ArithmeticError) as exc:
                raise StoreError(f"run {run}: column plan does not hold a plan ({exc!r}): the "
                                 "state database was changed by hand or by another program"
                                 ) from exc
        if row.get("manifest_json") is not None:
            manifest = _checked(run, "manifest_json", row["manifest_json"], dict, dict)
            checked, problem = stored_manifest(stored_text(manifest))
            if checked is not None:
                values["manifest"] = checked
            else:
                values["manifest_problem"] = f"run {run}: its stored manifest {problem}"
        return cls(**values)


class _StoredManifests:
    """The stored manifests (their JSON, by field name) validated so far in this process,
    the last ``size`` kept: a journey reads its run many times (the follower, the thread's
    messages, the decision, the volume), and each read would validate the same manifest
    again. The models are frozen and shared by the runs that read them."""

    def __init__(self, size: int = 64) -> None:
        self._size = size
        self._known: OrderedDict[str, tuple[Manifest | None, str | None]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, text: str) -> tuple[Manifest | None, str | None]:
        with self._lock:
            known = self._known.get(text)
            if known is not None:
                self._known.move_to_end(text)
                return known
        try:
            known = Manifest.model_validate_json(text, by_name=True), None
        except ValidationError as exc:
            known = None, (f"no longer validates ({exc.error_count()} problem(s), first: "
                           f"{'.'.join(str(p) for p in exc.errors()[0]['loc'])}: "
                           f"{exc.errors()[0]['msg']}); shown without the manifest's details")
        self._keep(text, known)
        return known

    def remember(self, manifest: Manifest) -> dict[str, Any]:
        """Keep ``manifest``, validated where it came in (the submitted text), as the model
        of the JSON the store records for it; that JSON (what to store)."""
        stored: dict[str, Any] = manifest.model_dump(mode="json")
        self._keep(stored_text(stored), (manifest, None))
        return stored

    def forget(self) -> None:
        with self._lock:
            self._known.clear()

    def _keep(self, text: str, known: tuple[Manifest | None, str | None]) -> None:
        with self._lock:
            self._known[text] = known
            self._known.move_to_end(text)
            while len(self._known) > self._size:
                self._known.popitem(last=False)


_STORED = _StoredManifests()


def stored_text(manifest_json: Mapping[str, Any]) -> str:
    """The key of a stored manifest: its JSON, keys sorted."""
    return json.dumps(manifest_json, sort_keys=True)


def stored_manifest(text: str) -> tuple[Manifest | None, str | None]:
    """A stored manifest (its JSON, by field name, as ``stored_text`` writes it) validated
    by today's ``Manifest``, once per text in this process (or never, when the submission
    that stored it ran here: ``remember_manifest``). (None, why) when it no longer
    validates."""
    return _STORED.get(text)


def remember_manifest(manifest: Manifest) -> dict[str, Any]:
    """The JSON to store for a manifest validated at its submission, remembered as
    ``manifest``: the run's readers share that model instead of validating it again."""
    return _STORED.remember(manifest)


def forget_stored_manifests() -> None:
    """Forget every stored manifest validated so far (as a bot just started)."""
    _STORED.forget()


def _checked(run: str, column: str, value: Any, stored: type, make: Any) -> Any:
    if not isinstance(value, stored) or (stored is int and isinstance(value, bool)):
        raise StoreError(f"run {run}: column {column} holds {type(value).__name__} "
                         f"{value!r}, not {stored.__name__}: the state database was changed "
                         "by hand or by another program")
    return make(value)
