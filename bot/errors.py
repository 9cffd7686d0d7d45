"""The bot's error tree. Every error a user sees says where and what to do.

Transports (console, Slack) catch PreflightError and show its message; anything else is
logged with its traceback and the user gets a short message with the run id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


class PreflightError(Exception):
    """Base of every expected failure shown to a user."""

    exit_code = 1


@dataclass(frozen=True)
class Problem:
    """One finding: where (field path, line, column, file) and what is wrong."""

    loc: str
    message: str
    line: int | None = None
    column: int | None = None
    file: str | None = None
    severity: str = "error"

    def to_dict(self) -> dict[str, Any]:
        return {"loc": self.loc, "line": self.line, "column": self.column,
                "message": self.message, **({"file": self.file} if self.file else {})}

    def __str__(self) -> str:
        where = self.loc or "(manifest)"
        if self.line is not None:
            where += f" (line {self.line}" + (f", column {self.column})" if self.column else ")")
        return f"{where}: {self.message}"


class ManifestError(PreflightError):
    """The manifest cannot be used; ``problems`` lists every error found, not only the first."""

    exit_code = 2

    def __init__(self, problems: list[Problem], *, source: str = "manifest",
                 warnings: list[Problem] | None = None) -> None:
        self.problems = problems
        self.warnings = warnings or []
        self.source = source
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"{source}: {len(problems)} problem(s)\n{lines}")


class ManifestUnreadable(ManifestError):
    """The file itself cannot be read (missing, not UTF-8, not YAML/JSON at all)."""


class StoreError(PreflightError):
    """SQLite failed underneath us (translated from sqlite3 / sqlite-utils errors)."""


class RunNotFound(PreflightError):
    exit_code = 2  # a bad invocation: the id names no run

    def __init__(self, run_id: str, detail: str | None = None) -> None:
        super().__init__(f"no run {run_id!r}" + (f": {detail}" if detail else "")
                         + ": `preflight runs` lists the known runs (a run is named by its "
                         "id, a unique prefix, `latest`, or a pilot's name)")
        self.run_id = run_id


class ItemNotFound(PreflightError):
    exit_code = 2  # a bad invocation: the id names no input of the run


class DispatchError(PreflightError):
    """The runner could not be started or followed on its node."""


class NodeUnreachable(DispatchError):
    """The node did not answer: the connection was refused, timed out or dropped, or a
    command ended with no exit status because its connection dropped. It says nothing
    about the runner, which may still be running; a later try may reach the node."""


class DispatchStopped(DispatchError):
    """The run was stopped while it was being started: the dispatch ends at its next step
    and stops what it had started on the nodes (Ray, the workdir locks)."""


class ContactLost(DispatchError):
    """A follower gave up reaching the node of a run that may still be running."""

    exit_code = 3

    def __init__(self, run_id: str, seconds: float, cause: str) -> None:
        super().__init__(
            f"lost contact with the node of run {run_id} for {seconds:.0f} s ({cause}); its "
            f"runner may still be running (nothing was judged). Follow it again: "
            f"preflight follow {run_id}")
        self.run_id = run_id


class DecisionRefused(PreflightError):
    """A decision that the rules do not allow; it is recorded as refused all the same."""


class VolumeExists(DecisionRefused):
    """A pilot already launched its volume run: one approval launches at most one volume."""

    def __init__(self, pilot: str, volume: str) -> None:
        super().__init__(f"pilot {pilot} already launched the volume run {volume}: "
                         "one approval launches at most one volume")
        self.pilot = pilot
        self.volume = volume


class LeaseError(PreflightError):
    """A lease state change that is not allowed, or a dispatch to a node not provisioned."""


class ProjectCheckError(PreflightError):
    """The project directory fails the checks the guide prescribes."""

    def __init__(self, problems: list[Problem]) -> None:
        self.problems = problems
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"project check: {len(problems)} problem(s)\n{lines}")


class PolicyError(PreflightError):
    """The bot's policy file cannot be used: the bot does not start (every problem, by line)."""

    exit_code = 2

    def __init__(self, problems: list[Problem], *, source: str = "policy") -> None:
        self.problems = problems
        self.source = source
        lines = "\n".join(f"  - {p}" for p in problems)
        super().__init__(f"policy file {source}: {len(problems)} problem(s)\n{lines}")


class PolicyRefused(PreflightError):
    """The bot's policy does not allow this action; nothing was run, read or changed.

    ``refusals`` name each rule broken and where it is configured; the refusal is recorded.
    """

    exit_code = 2

    def __init__(self, action: str, refusals: list[Any]) -> None:
        self.action = action
        self.refusals = refusals
        super().__init__(f"refused by the bot's policy ({action}): "
                         + "; ".join(str(r) for r in refusals))
