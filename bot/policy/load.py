"""Read the policy file with line numbers, like a manifest; the defaults when there is none.

``load_policy`` is called once at start (``preflight serve`` and the CLI): a broken file
stops the bot with every problem named by key and line; a missing file at the default
place gives the built-in defaults, which are the safe ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from bot.errors import PolicyError, Problem
from bot.manifest.source import DOCUMENT, SourceError, SourceMap, format_loc, parse_text
from bot.policy.model import PolicyFile
from bot.settings import Settings


@dataclass(frozen=True)
class Policy:
    """The policy in force: the validated file, where it came from, the resolved roots."""

    file: PolicyFile
    path: Path
    from_file: bool
    home: Path
    extra_approvers: frozenset[str] = frozenset()  # PREFLIGHT_APPROVERS, also bot-owned
    marks: SourceMap = field(default_factory=SourceMap)

    @property
    def roots(self) -> tuple[Path, ...]:
        """Where a Slack manifest may read and write (symlinks of the roots resolved)."""
        roots = self.file.project_roots
        chosen = [Path(r) for r in roots] if roots is not None else [self.home / "projects"]
        return tuple(r.resolve() for r in chosen)

    def roots_for(self, channel: str | None,
                  groups: frozenset[str] = frozenset()) -> tuple[tuple[Path, ...], str]:
        """The roots of a Slack request from ``channel`` by a member of ``groups``, and the
        key that sets them: the ``team_roots`` entries naming that channel or one of those
        groups (their union, plus ``project_roots`` where an entry is ``shared``), else the
        global ``project_roots``."""
        teams = [(i, t) for i, t in enumerate(self.file.team_roots)
                 if (channel is not None and channel in t.channels) or groups & set(t.groups)]
        if not teams:
            return self.roots, "project_roots"
        chosen = [Path(r).resolve() for _, t in teams for r in t.roots]
        if any(t.shared for _, t in teams):
            chosen += self.roots
        return tuple(dict.fromkeys(chosen)), ", ".join(f"team_roots.{i}" for i, _ in teams)

    @property
    def warnings(self) -> list[str]:
        """What to say at start: a role held through a Slack user group is held by anyone
        who can edit that group (in Slack's default settings, every full member)."""
        roles = self.file.roles
        out = []
        for role in ("submitters", "approvers", "lease_operators", "admins"):
            groups = [g for g in getattr(roles, role) or [] if g.startswith("S")]
            if groups:
                out.append(f"roles.{role} names Slack user group(s) {', '.join(groups)} "
                           f"({self.where('roles.' + role)}): whoever may edit a group's "
                           f"members holds this role; let only admins edit user groups "
                           "(workspace settings → Permissions → User Groups) or list user "
                           "ids instead")
        return out

    def where(self, key: str) -> str:
        """Where the rule ``key`` (dotted, e.g. ``roles.approvers``, ``team_roots.0``) is
        configured; several keys separated by ", " are each placed."""
        if ", " in key:
            return "; ".join(self.where(k) for k in key.split(", "))
        if not self.from_file:
            return f"built-in default of {key} (no policy file at {self.path})"
        loc = tuple(int(k) if k.isdigit() else k for k in key.split("."))
        found, rest = self.marks.resolve(loc)
        if found == loc and loc in self.marks.marks:
            return f"{self.path} line {self.marks.marks[loc][0]} ({key})"
        return f"default of {key} ({key} is not set in {self.path})"


def default_policy(home: Path, path: Path | None = None,
                   extra_approvers: frozenset[str] = frozenset()) -> Policy:
    return Policy(PolicyFile(), path or home / "policy.yaml", False, home, extra_approvers)


def policy_for(settings: Settings) -> Policy:
    """The policy of this bot host: ``settings.policy_path`` (must exist when set
    explicitly), else ``$PREFLIGHT_HOME/policy.yaml`` when present, else the defaults."""
    explicit = settings.policy_path is not None
    path = settings.policy_path or settings.home / "policy.yaml"
    if not explicit and not path.exists():
        return default_policy(settings.home, path, settings.approvers)
    return load_policy(path, home=settings.home, extra_approvers=settings.approvers)


def load_policy(path: Path, *, home: Path,
                extra_approvers: frozenset[str] = frozenset()) -> Policy:
    """Read and validate ``path``; PolicyError listing every problem with its line."""
    source = str(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as exc:
        raise PolicyError([Problem(DOCUMENT, f"cannot read the policy file: "
                                   f"{exc.strerror or exc}")], source=source) from exc
    except UnicodeDecodeError as exc:
        raise PolicyError([Problem(DOCUMENT, f"not UTF-8 text (byte {exc.start})")],
                          source=source) from exc
    if not text.strip():
        return Policy(PolicyFile(), path, True, home, extra_approvers)
    try:
        data, marks = parse_text(text)
    except SourceError as exc:
        raise PolicyError(exc.problems, source=source) from exc
    if not isinstance(data, dict):
        line, column = marks.locate(())
        raise PolicyError([Problem(DOCUMENT, "expected a mapping of keys (roles, nodes, "
                                   "project_roots, ...)", line, column)], source=source)
    try:
        model = PolicyFile.model_validate(data)
    except ValidationError as exc:
        problems = [_problem(error, marks) for error in exc.errors(include_url=False)]
        raise PolicyError(sorted(problems, key=lambda p: (p.line or 0, p.column or 0)),
                          source=source) from exc
    return Policy(model, path, True, home, extra_approvers, marks)


def _problem(error: Any, marks: SourceMap) -> Problem:
    loc: Sequence[Any] = tuple(error["loc"])
    line, column = marks.locate(loc)
    kind = error["type"]
    if kind == "extra_forbidden":
        message = f"unknown key {str(loc[-1])!r}"
    elif kind == "missing":
        message = f"missing required key {str(loc[-1])!r}"
    elif kind == "string_pattern_mismatch":
        message = (f"{error.get('input')!r} is not a Slack id: roles list user ids (U…, W…; "
                   "profile → ⋮ → Copy member ID) or user group ids (S…)")
    else:
        text = str(error["msg"]).removeprefix("Value error, ")
        message = f"{text[:1].lower()}{text[1:]}"
    return Problem(format_loc(loc) or DOCUMENT, message, line, column)
