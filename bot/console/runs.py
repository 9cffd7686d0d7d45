"""`preflight runs` as plain lines that fit the terminal (80 columns and up)."""

from __future__ import annotations

from collections.abc import Sequence

from bot.messages.views import lease_refused
from bot.pilot.record import Run, RunRecord
from bot.pilot.track_record import record_line, score_of

STATUS_WORDS = {"awaiting_decision": "to decide", "dispatching": "starting",
                "dispatch_failed": "no start"}
PILOT_MAX = 24


def runs_lines(rows: Sequence[RunRecord], width: int = 80) -> list[str]:
    """One line per run: the id's time stamp (a unique prefix to type), the pilot's name
    and attempt beside it, status, outcome, stage reached, then the first error cut to
    what is left of the line."""
    cells = [(r.id.split("-", 1)[0], _pilot(r),
              "refused (lease)" if lease_refused(r) else STATUS_WORDS.get(r.status, r.status),
              r.outcome or "",
              r.stage_reached or "", _forecast(r), _note(r)) for r in rows]
    head = ("run", "pilot", "status", "outcome", "stage", "forecast", "first error")
    fixed_cells = len(head) - 1
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(fixed_cells)]
    out = []
    for cell in [head, *cells]:
        fixed = "  ".join(cell[i].ljust(widths[i]) for i in range(fixed_cells))
        room = max(0, width - len(fixed) - 2)
        out.append((fixed + "  " + _cut(cell[-1], room)).rstrip() if room else fixed.rstrip())
    summary = record_line(rows)
    if summary:  # how far to trust the next forecast
        out.append(summary)
    return out


def _forecast(run: RunRecord) -> str:
    """A volume's forecast scored against its actual: error against the middle, in or out
    of the range (* scored on the items its attempts recorded)."""
    score = score_of(run)
    return score.cell() if score is not None else ""


def _pilot(run: RunRecord) -> str:
    attempt = f"{'v' if run.kind == 'volume' else 'a'}{run.attempt}"
    return _cut(run.name, PILOT_MAX - len(attempt) - 1) + " " + attempt


def _note(run: RunRecord) -> str:
    """The first error, after when retention pruned the run's item rows."""
    pruned = f"[item rows pruned {run.items_pruned_at[:10]}] " if run.items_pruned_at else ""
    return (pruned + _error(run)).strip()


def _error(run: RunRecord) -> str:
    err = (run.first_error if isinstance(run, Run) else None) or {}
    return " ".join(f"{err.get('stage')}: {err.get('message', '')}".split()) if err else ""


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: max(0, limit - 1)] + "…"
