"""The report page's parts shared by its sections: what a page is made of (``ReportData``),
its style and content policy, and the HTML pieces every section is built with (a section,
a table, a value as text, a picture that may fail, the line under a cut table).

``bot/messages/report.py`` renders the page; ``report_node.py`` the sections of what the
node measured.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from bot.pilot.payloads import StoredForecast
from bot.pilot.record import Run

log = logging.getLogger(__name__)

# The most rows one per-item table of the page shows (checksums, the balance's problems and
# categories); the rest is counted and pointed to (SHA256SUMS, balance.csv), so a run of a
# million outputs still makes a page that opens and attaches (issue 35: <= 5 MB at 1M).
REPORT_ROWS = 200

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:#212121;
max-width:60rem;margin:1.5rem auto;padding:0 1rem}
h1{font-size:1.5rem;margin:.2rem 0}h2{font-size:1.1rem;border-bottom:1px solid #ddd;
padding-bottom:.2rem;margin-top:1.8rem}
table{border-collapse:collapse;width:100%;margin:.4rem 0;font-size:13px}
th,td{border:1px solid #e0e0e0;padding:.25rem .45rem;text-align:left;vertical-align:top}
th{background:#f5f5f5}td.num{text-align:right;font-variant-numeric:tabular-nums}
.ok{color:#2e7d32;font-weight:600}.bad{color:#c62828;font-weight:600}.warn{color:#b26a00;font-weight:600}.muted{color:#757575}
.badge{display:inline-block;padding:.1rem .5rem;border-radius:.3rem;color:#fff;font-weight:600}
.badge.ok{background:#2e7d32;color:#fff}.badge.bad{background:#c62828;color:#fff}
.formula{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;color:#424242}
.grid{display:grid;grid-template-columns:1fr 1fr;gap:1rem}
code,.mono{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px}
svg{max-width:100%;height:auto}
.note{background:#fff8e1;border-left:3px solid #ffb300;padding:.3rem .6rem;margin:.3rem 0}
@media print{body{margin:0;max-width:none;font-size:11px}section{break-inside:avoid}
a{color:inherit;text-decoration:none}}
"""


# The page runs no script and loads nothing: only its inline style and inline pictures.
# Every text in it is escaped; this is the second wall, should one ever not be.
CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:; script-src 'none'"


@dataclass(frozen=True)
class ReportData:
    run: Run
    stages: list[dict[str, Any]]
    decisions: list[dict[str, Any]]
    generated_at: str
    item_times: list[float] = field(default_factory=list)         # s since the run started
    item_points: list[tuple[float, float]] = field(default_factory=list)  # (bytes, s)
    checksums: list[tuple[str, str]] = field(default_factory=list)  # (sha256, path): the first
    checksums_from: str = ""
    checksums_total: int | None = None  # how many there are in all (None: those shown)
    checksums_rest: str = ""  # where the ones not shown are listed
    parent_forecast: StoredForecast | None = None
    # A volume run: the pilot and the approval that launched it, and its engine (workers,
    # items, work seconds, attempts and stops). A pilot: the volume run it launched.
    launched_by: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    volume_run: str | None = None


def drawn(draw: Callable[..., str], *args: Any) -> str:
    """A picture, or a line saying it could not be drawn: what a node reported (a stage
    name, a loss that is no number) never costs the page itself."""
    try:
        return draw(*args)
    except Exception as exc:  # matplotlib's errors are many; the page must still be written
        log.warning("a picture of the report was not drawn: %s: %s", type(exc).__name__, exc)
        return (f'<p class="muted">A picture was not drawn: {escape(type(exc).__name__)}: '
                f'{escape(str(exc)[:200])}</p>')


def section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{body}</section>'


def table(columns: tuple[str, ...], rows: list[tuple[Any, ...]], num: tuple[int, ...] = ()
           ) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f'<td class="num">{escape(as_text(v))}</td>' if i in num
        else f"<td>{escape(as_text(v))}</td>" for i, v in enumerate(row)) + "</tr>"
        for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def as_text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(as_text(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={as_text(v)}" for k, v in value.items())
    return str(value)


def more(total: int, where: str, shown: int = REPORT_ROWS) -> str:
    """The line under a table cut at ``shown`` rows: how many more, and where they are."""
    if total <= shown:
        return ""
    return (f'<p class="note">… and {total - shown} more: see {escape(where)}</p>')


def num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def stage_facts(data: ReportData, stage: str) -> dict[str, Any]:
    for s in data.stages:
        if s.get("stage") == stage:
            return dict(s.get("facts") or {})
    return {}
