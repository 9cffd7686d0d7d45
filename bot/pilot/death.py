"""What to say when a runner ended without reporting the end of its run (pure rules)."""

from __future__ import annotations

import re
import signal
from typing import Any

from runner.events import Event

# Lines of a log that are noise beside the runner's own last words: warnings of libraries
# imported on the way (and the source line Python prints under each) and the runner's
# echoed JSON events.
_WARNING = re.compile(r"\b\w*Warning: ")


def how_it_ended(code: int | None) -> str:
    """``exit code`` in words: a signal is named, an unknown status said so (never None)."""
    if code is None:
        return "the runner is gone (this process did not start it, so its exit status is " \
               "not known here)"
    if code < 0:
        return f"the runner died, killed by signal {-code} ({_signame(-code)})"
    if code > 128 and code - 128 < 65:
        return (f"the runner exited with status {code} (128 + signal {code - 128}, "
                f"{_signame(code - 128)})")
    return f"the runner exited with status {code}"


def runner_death(stage: str | None, code: int | None, last_event: Event | None,
                 log_text: str) -> dict[str, Any]:
    """The first error of a run whose runner ended without ``run.finished``."""
    parts = [f"{how_it_ended(code)} during stage {stage or 'prepare'}, without reporting "
             "the end of the run"]
    if last_event is not None:
        parts.append(f"its last event: {describe_event(last_event)}")
    tail = last_output(log_text)
    if tail:
        parts.append(f"its last output: {tail}")
    return {"stage": stage or "prepare", "type": "RunnerExited", "message": "; ".join(parts),
            "hint": "runner.log in the run directory has its whole output; a kill -9 or "
                    "the out-of-memory killer (dmesg) ends a runner this way; "
                    "`preflight resume RUN` continues from the ledger"}


def describe_event(event: Event) -> str:
    what = event.data.get("id") or event.stage or ""
    if event.type == "progress":
        what = f"{event.data.get('done')}/{event.data.get('total')} items"
    return f"#{event.seq} {event.type}{f' {what}' if what else ''} at {event.ts}"


def last_output(log_text: str, lines: int = 3, limit: int = 400) -> str:
    """The runner's own last lines: not its echoed events, not library warnings."""
    kept: list[str] = []
    skip_next = False
    for line in log_text.splitlines():
        if skip_next and line.startswith((" ", "\t")):
            skip_next = False
            continue
        skip_next = False
        if not line.strip() or line.lstrip().startswith("{"):
            continue
        if _WARNING.search(line):
            skip_next = True  # Python prints the warning's source line under it
            continue
        kept.append(line.strip())
    return " | ".join(kept[-lines:])[-limit:]


def _signame(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"
