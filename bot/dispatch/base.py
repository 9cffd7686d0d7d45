"""The Dispatcher protocol and the RunHandle every dispatcher works on.

A dispatcher starts ``python -m runner SPEC --run-dir DIR`` somewhere and hands back the
events it appends to ``events.jsonl``, read by byte offset so a follower (or a restarted
bot) resumes exactly where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bot.dispatch.plan import LaunchPlan
from bot.errors import DispatchError
from runner.events import Event, EventFormatError

LOG_TAIL_BYTES = 64 * 1024  # of the runner's output kept to describe a runner that died


@dataclass(frozen=True)
class Decision:
    """What the service decided on hearing a step of a start, handed back to the dispatch
    as the step's answer (never written into a file the dispatch writes too): the volume
    driver's time limit, widened to the forecast on the proven nodes once every node is
    proven (``bot/service/proven.py``)."""

    time_limit_s: float | None = None


# How a start reports its steps (``runner.events.DISPATCH_NODE``'s fields: node, index,
# phase, ...), and hears the service's decision on a step (None: nothing decided). It may
# raise ``bot.errors.DispatchStopped``: the run was stopped meanwhile.
Progress = Callable[[dict[str, Any]], "Decision | None"]


def no_progress(step: dict[str, Any]) -> Decision | None:
    """The report of a start nobody follows."""
    return None


@dataclass(frozen=True)
class RunHandle:
    run_id: str
    run_dir: Path  # the run directory on the bot host (events are read from here)
    spec_path: Path
    project_dir: Path
    pid: int | None = None
    resume: bool = False
    node: dict[str, Any] | None = None  # the manifest's node section, when the caller has it
    # an explicit fetch (`preflight fetch RUN`): the run's own caps, sized from its pilot
    # (bot/pilot/fetch_caps.py), give way to the bot host's ceiling
    ceiling: bool = False
    # what a start needs of the run's manifest, taken once by the service (bot/dispatch/
    # plan.py); None: read from the run directory by ``plan.plan_of`` (a test, a tool)
    plan: LaunchPlan | None = field(default=None, compare=False, repr=False)
    # Where ``start`` reports each step of a several-node volume's dispatch (uploaded,
    # proved, Ray up per node); the service records and shows them, and stops the dispatch
    # by raising DispatchStopped from it.
    progress: Progress = field(default=no_progress, compare=False, repr=False)


class Dispatcher(Protocol):
    def start(self, handle: RunHandle) -> int | None:
        """Start the runner; return its pid where that means something to ``is_alive``.
        Long steps are reported through ``handle.progress``; a ``DispatchStopped`` it
        raises ends the start, and what it had started is stopped."""

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        """Complete events appended since ``offset`` and the offset after them, as written:
        item events come as ``item.batch`` events (``runner.events.expand_items`` gives
        one item.done each; the store records a batch as it is)."""

    def is_alive(self, handle: RunHandle) -> bool:
        """Whether the runner process is still running. It only looks: what the runner's
        start brought up beside it is ended by ``clean_up`` or ``fetch_results``."""

    def clean_up(self, handle: RunHandle) -> list[str]:
        """The runner has ended without its results being fetched (it died, or never
        started): stop what its start brought up beside it (a several-node volume's Ray on
        every node). Returns the problems met, [] when nothing is left; a later call tries
        again."""

    def exit_code(self, handle: RunHandle) -> int | None:
        """The runner's exit status once it has ended and it is known, else None."""

    def fetch_results(self, handle: RunHandle) -> Path | None:
        """Bring the run directory's results back to the bot host (no-op when local);
        return the evidence copy on the bot host when one was fetched and verified."""

    def stop(self, handle: RunHandle) -> None:
        """Stop the runner (used on shutdown of tests, never on a bot restart)."""

    def log_tail(self, handle: RunHandle, limit: int = LOG_TAIL_BYTES) -> str:
        """The end of the runner's own output (``runner.log`` where the runner ran: this
        host, or the node); "" when there is none or it cannot be read now."""

    def close(self) -> None:
        """Release what the dispatcher holds open (connections, an event loop); a later
        call opens them again."""



def json_object(text: str) -> dict[str, Any] | None:
    """The one JSON object a node printed (a launcher's or a listing's answer), or None when
    it printed anything else (a login banner, nothing, another JSON value)."""
    try:
        answer = json.loads(text)
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None


def first_difference(ours: Mapping[str, Any], theirs: Mapping[str, Any],
                     key: Callable[[str], Any] | None = None) -> tuple[str, str] | None:
    """The first name (in ``key``'s order, else sorted) at which two listings differ, and
    how: ``missing`` (ours only), ``extra`` (theirs only) or ``differs``; None when equal."""
    for name in sorted(set(ours) | set(theirs), key=key):
        if name not in theirs:
            return name, "missing"
        if name not in ours:
            return name, "extra"
        if ours[name] != theirs[name]:
            return name, "differs"
    return None


def events_error(handle: RunHandle, where: str, exc: EventFormatError) -> DispatchError:
    """The bot's error for a line of the runner's ``events.jsonl`` that is not an event:
    the run, the file (``where``) and what to do; raise it ``from exc``."""
    return DispatchError(f"run {handle.run_id}: {where} has a line that is not an event "
                         f"({exc}); the run cannot be followed past it: look at that file "
                         f"and the runner's log, then `preflight stop {handle.run_id}`")


def read_tail(path: Path, limit: int = LOG_TAIL_BYTES) -> str:
    """The last ``limit`` bytes of a local file as text ("" when it cannot be read)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(max(0, path.stat().st_size - limit))
            return fh.read().decode("utf-8", errors="replace")
    except OSError:
        return ""
