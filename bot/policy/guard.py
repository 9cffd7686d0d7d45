"""PolicyGuard: how the service enforces the bot's policy, and records what it refuses.

The rules are pure functions in ``bot.policy.checks``; this is where they meet the store
(refusals are recorded with who and what; the runs a lease gates are looked up) and the
directory of user groups. ``PilotService`` calls it before a manifest is read, when a run
is submitted, before an approval and for every lease change from a transport.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol

from bot.errors import PolicyRefused
from bot.manifest.load import LoadedManifest, ParsedText
from bot.manifest.model import Inputs, VolumeInputs
from bot.manifest.source import SourceError, parse_text
from bot.pilot import leases as lease_rules
from bot.pilot.record import Run
from bot.policy import checks
from bot.policy.checks import Identity, Refusal
from bot.policy.load import Policy
from bot.policy.model import Origin
from runner.inputs import InputsError

# (Slack user id, the user groups the policy's roles name) -> those groups the user is in;
# given by the Slack transport (bot.slack.directory) to the service it builds.
Directory = Callable[[str, Sequence[str]], frozenset[str]]


@dataclass(frozen=True)
class ScreenedManifest(LoadedManifest):
    """A manifest loaded for a submission after the policy screened its text, whose files
    the policy then checked for ``screened_for`` (user, origin, channel): admitting it for
    the same request does not check them again."""

    screened_for: tuple[str, Origin, str | None] = ("", "cli", None)


class RefusalStore(Protocol):
    def record_refusal(self, record: dict[str, Any]) -> None: ...
    def runs_waiting_on_node(self, host: str, port: int = 22) -> list[Run]: ...


class PolicyGuard:
    def __init__(self, policy: Policy, store: RefusalStore, *,
                 directory: Directory | None = None) -> None:
        self.policy = policy
        self.store = store
        self.directory = directory

    def identity(self, user: str, origin: Origin, channel: str | None = None) -> Identity:
        groups = (self.directory(user, checks.group_ids(self.policy))
                  if self.directory and origin == "slack" else frozenset())
        return Identity(user, groups, channel)

    # -- submit -------------------------------------------------------------------------
    def screen(self, text: str | ParsedText, *, source: str, base_dir: Path, user: str,
               origin: Origin, channel: str | None = None) -> None:
        """Refuse a manifest before anything it names on disk is looked at (``text``: as
        parsed by ``parse_manifest``, or the text itself)."""
        if isinstance(text, str):
            try:
                data, marks = parse_text(text)
            except SourceError:
                return  # unreadable: load_manifest says where, and reads nothing
        elif text.marks.duplicates:
            return  # a repeated key: load_manifest says where, and reads nothing
        else:
            data, marks = text.data, text.marks
        refusals = checks.check_submission(self.policy, data, marks, origin=origin,
                                           who=self.identity(user, origin, channel),
                                           base_dir=base_dir)
        self.refuse("submit", user, origin, _name(data) or source, refusals)

    def admit(self, loaded: LoadedManifest, *, user: str, origin: Origin,
              inputs: Inputs | VolumeInputs | None = None,
              channel: str | None = None) -> tuple[list[str], bool]:
        """Check a loaded manifest again (whoever the caller is) and the files it would read
        (unless ``screened`` checked them for the same request); return the approvers and
        the two-person flag the run is recorded with."""
        m = loaded.manifest
        refusals = checks.check_submission(self.policy, loaded.data, loaded.marks,
                                           origin=origin,
                                           who=self.identity(user, origin, channel),
                                           base_dir=loaded.base_dir)
        self.refuse("submit", user, origin, m.name, refusals)
        volume = m.volume.inputs if m.volume is not None else None
        if not (isinstance(loaded, ScreenedManifest)
                and loaded.screened_for == (user, origin, channel)
                and inputs in (None, volume)):
            self.check_files(loaded, user=user, origin=origin, inputs=inputs, channel=channel)
        return (checks.effective_approvers(self.policy, m.approvals.approvers, origin),
                checks.two_person(self.policy, m.approvals.two_person))

    def screened(self, loaded: LoadedManifest, *, user: str, origin: Origin,
                 channel: str | None = None) -> ScreenedManifest:
        """``check_files``, then the manifest marked as checked for this request (its text
        was screened before it was loaded)."""
        self.check_files(loaded, user=user, origin=origin, channel=channel)
        return ScreenedManifest(**{f.name: getattr(loaded, f.name)
                                   for f in fields(LoadedManifest)},
                                screened_for=(user, origin, channel))

    def check_files(self, loaded: LoadedManifest, *, user: str, origin: Origin,
                    inputs: Inputs | VolumeInputs | None = None,
                    channel: str | None = None) -> None:
        """From Slack: the input and parameter files must not lead out of the roots (checked
        before the project check opens the parameter files)."""
        if origin == "slack":
            refusals = checks.check_files(self.policy, _files(loaded, inputs), "file",
                                          self.identity(user, origin, channel))
            self.refuse("submit", user, origin, loaded.manifest.name, refusals)

    def nodes_again(self, run: Run, user: str, origin: Origin = "cli") -> None:
        """A run submitted from Slack, started again (resume): its nodes and programs are
        checked against the policy in force now, as at its submission."""
        if not run.channel:
            return  # the terminal's run: nodes are not the policy's business
        try:
            data, marks = parse_text(run.manifest_text or "")
        except SourceError:
            return
        refusals = checks.check_nodes(self.policy, data, marks)
        self.refuse("resume", user, origin, run.id, refusals)

    # -- act on a run: stop, decide, its buttons ----------------------------------------
    def run_action(self, action: str, run: Run, user: str, origin: Origin,
                   channel: str | None) -> None:
        """PolicyRefused (recorded) unless ``user`` may ``action`` this run from here."""
        refusals = checks.check_run_action(self.policy, run,
                                           self.identity(user, origin, channel), origin, action)
        self.refuse(action, user, origin, run.id, refusals)

    # -- approve ------------------------------------------------------------------------
    def approval(self, run: Run, user: str, origin: Origin) -> list[Refusal]:
        refusals = checks.check_approval(self.policy, run, self.identity(user, origin), origin)
        self.record("approve", user, origin, run.id, refusals)
        return refusals

    # -- leases -------------------------------------------------------------------------
    def lease_change(self, node: str, state: str, user: str, origin: Origin) -> None:
        host, port = lease_rules.split_key(node) if node.strip() else ("", 22)
        waiting = self.store.runs_waiting_on_node(host, port) if host else []
        refusals = checks.check_lease_change(self.policy, self.identity(user, origin), origin,
                                             state, waiting)
        self.refuse("lease", user, origin, f"{node} -> {state}", refusals)

    # -- recording ----------------------------------------------------------------------
    def refuse(self, action: str, user: str, origin: Origin, subject: str,
               refusals: Sequence[Refusal]) -> None:
        if refusals:
            self.record(action, user, origin, subject, refusals)
            raise PolicyRefused(action, list(refusals))

    def record(self, action: str, user: str, origin: Origin, subject: str,
               refusals: Sequence[Refusal]) -> None:
        for refusal in refusals:
            self.store.record_refusal({"who": user, "origin": origin, "action": action,
                                       "subject": subject, **refusal.to_dict()})


def _name(data: Any) -> str | None:
    name = data.get("name") if isinstance(data, dict) else None
    return name if isinstance(name, str) else None


def _files(loaded: LoadedManifest, inputs: Inputs | VolumeInputs | None) -> list[Path]:
    """The inputs a run would read (as listed when the manifest was loaded) and the
    project's parameter files."""
    project = loaded.project_dir
    out: list[Path] = []
    volume = loaded.manifest.volume
    sections: list[Inputs | VolumeInputs | None] = [
        loaded.manifest.inputs, inputs or (volume.inputs if volume else None)]
    for section in sections:
        if section is None:
            continue
        try:
            out += [f.path for f in loaded.listing(section).files]
        except InputsError:
            continue  # the manifest rules report it
    config = project / "config"
    if config.is_dir():
        out += [p for p in config.rglob("*") if p.is_file() or p.is_symlink()]
    return out
