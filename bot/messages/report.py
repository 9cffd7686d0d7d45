"""``report.html``: one self-contained page that tells a run's story, worth forwarding.

``render_report(ReportData) -> str`` is pure: the data comes from the store and the run
directory (``bot/service/report_files.py`` gathers and writes it). The page has no external asset
(inline CSS, inline SVG plots from ``bot.messages.plots``), opens offline and prints.
Each section carries an ``id`` (plan, forecast, stages, devices, compute, memory, balance,
decisions, checksums, and resume for a training pilot) so tests and readers can find it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from html import escape
from typing import Any

from bot.messages import plots
from bot.messages.forecast_view import check_rows, fit_line
from bot.pilot.balance_check import NODE_LISTED, node_listed
from bot.pilot.cards import healthy_cards
from bot.pilot.clock import read_time
from bot.pilot.forecast import duration
from bot.pilot.plan import format_usd
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
    parent_forecast: dict[str, Any] | None = None
    # A volume run: the pilot and the approval that launched it, and its engine (workers,
    # items, work seconds, attempts and stops). A pilot: the volume run it launched.
    launched_by: dict[str, Any] | None = None
    engine: dict[str, Any] | None = None
    volume_run: str | None = None


def render_report(data: ReportData) -> str:
    run = data.run
    sections = [_header(data), _plan(run), _forecast(data), _stages(data), _devices(data),
                _compute(data), _memory(data), _balance(run), _resume(data), _engine(data),
                _decisions(data), _checksums(data)]
    title = f"Preflight report — {run.name} ({run.id})"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "".join(s for s in sections if s) + "</body></html>\n")


def _drawn(draw: Callable[..., str], *args: Any) -> str:
    """A picture, or a line saying it could not be drawn: what a node reported (a stage
    name, a loss that is no number) never costs the page itself."""
    try:
        return draw(*args)
    except Exception as exc:  # matplotlib's errors are many; the page must still be written
        log.warning("a picture of the report was not drawn: %s: %s", type(exc).__name__, exc)
        return (f'<p class="muted">A picture was not drawn: {escape(type(exc).__name__)}: '
                f'{escape(str(exc)[:200])}</p>')


def _section(sid: str, title: str, body: str) -> str:
    return f'<section id="{sid}"><h2>{escape(title)}</h2>{body}</section>'


def _table(columns: tuple[str, ...], rows: list[tuple[Any, ...]], num: tuple[int, ...] = ()
           ) -> str:
    head = "".join(f"<th>{escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(
        f'<td class="num">{escape(_text(v))}</td>' if i in num else f"<td>{escape(_text(v))}</td>"
        for i, v in enumerate(row)) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _text(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, (list, tuple)):
        return ", ".join(_text(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={_text(v)}" for k, v in value.items())
    return str(value)


def _header(data: ReportData) -> str:
    run = data.run
    verdict = run.verdict or {}
    passed = bool(verdict.get("passed"))
    badge = (f'<span class="badge {"ok" if passed else "bad"}">'
             f'{"PASSED" if passed else "FAILED"}</span>' if verdict else
             f'<span class="badge bad">{escape(str(run.status))}</span>')
    kind = "Volume run" if run.kind == "volume" else "Pilot"
    checks = "".join(f'<li class="{"warn" if c.get("warn") else "ok" if c.get("ok") else "bad"}">'
                     f'{"⚠" if c.get("warn") else "✓" if c.get("ok") else "✗"} '
                     f'{escape(str(c.get("text")))}</li>' for c in verdict.get("checks") or [])
    err = run.first_error or {}
    first = (f'<p class="bad">First error at stage <b>{escape(str(err.get("stage")))}</b>: '
             f'{escape(str(err.get("type") or ""))}: {escape(str(err.get("message") or ""))}'
             f'</p>' if err else "")
    meta = (f'<p class="muted">run <code>{escape(run.id)}</code> · attempt '
            f'{run.attempt} · submitted by {escape(str(run.submitter))} · '
            f'status {escape(str(run.status))} · report written {escape(data.generated_at)}'
            f'</p>')
    return (f'<header id="verdict"><h1>{kind} {escape(run.name)} {badge}</h1>{meta}'
            f"<ul>{checks}</ul>{first}</header>")


def _plan(run: Run) -> str:
    plan = run.plan
    if plan is None:
        return _section("plan", "Plan", '<p class="muted">No plan was recorded.</p>')
    rows = [("GPU", plan.gpu), ("Lots", f"{plan.lots} × {plan.cards_per_lot}"
             f" card(s) = {plan.total_cards} cards"), ("Days", plan.days),
            ("Price per lot per day", f"{format_usd(plan.lot_price_usd_per_day)} USD"),
            ("Total", f"{format_usd(plan.total_usd)} USD"),
            ("Backend / preparation", f"{plan.backend} / {plan.preparation}"),
            ("Lease", f"{plan.starts_at or 'start not set'} → "
                      f"{plan.ends_at or '?'}")]
    body = _table(("item", "value"), rows)
    body += f'<p class="formula">{escape(plan.formula)}</p>'
    body += "".join(f'<p class="muted">{escape(n)}</p>' for n in plan.notes)
    return _section("plan", "Plan", body)


def _forecast(data: ReportData) -> str:
    fc = data.run.forecast
    if not fc:
        return _section("forecast", "Forecast of the volume",
                        '<p class="muted">No volume section: nothing to forecast.</p>')
    if "actual_s" in fc:
        body = (_table(("figure", "value"), check_rows(fc))
                + f'<p class="formula">{escape(str(fc.get("formula") or ""))}</p>')
        parent = data.parent_forecast or {}
        if parent.get("figures"):
            body += "<p><b>The pilot's forecast</b>, as the approver saw it</p>" + _table(
                ("figure", "value", "formula"),
                [(f["label"], f["value"], f["formula"]) for f in parent["figures"]])
        return _section("forecast", "Forecast against the actual", body)
    if not fc.get("possible"):
        return _section("forecast", "Forecast of the volume",
                        f'<p class="note">No forecast: {escape(str(fc.get("reason")))}</p>')
    fits = fc.get("fits")
    cls = "ok" if fits else "bad" if fits is False else ""
    body = f'<p class="{cls}">{escape(fit_line(fc))}</p>'
    body += _table(("figure", "value", "formula"),
                   [(f["label"], f["value"], f["formula"]) for f in fc.get("figures") or []])
    body += "".join(f'<p class="note">{escape(str(n))}</p>' for n in fc.get("notes") or [])
    if data.item_points and any(b for b, _ in data.item_points):
        body += _drawn(plots.time_against_size, data.item_points, fc.get("fit"))
    return _section("forecast", "Forecast of the volume", body)


def stage_bars(stages: list[dict[str, Any]]) -> list[tuple[str, float, float, str]]:
    """(name, start s, duration s, state) of each stage that started, from the first start."""
    timed = [(s, read_time(s.get("started_at")), read_time(s.get("ended_at"))) for s in stages]
    starts = [b for _, b, _ in timed if b is not None]
    if not starts:
        return []
    zero = min(starts)
    return [(str(s["stage"]), (b - zero).total_seconds(),
             ((e or b) - b).total_seconds(), str(s.get("state")))
            for s, b, e in timed if b is not None]


def _stages(data: ReportData) -> str:
    bars = stage_bars(data.stages)
    rows = []
    for s in data.stages:
        b, e = read_time(s.get("started_at")), read_time(s.get("ended_at"))
        length = f"{(e - b).total_seconds():.3f}" if b and e else ""
        detail = (s.get("error") or {}).get("message") if s.get("error") else s.get("reason")
        rows.append((s["stage"], s.get("state"), length, detail or ""))
    body = _drawn(plots.stage_timeline, bars) if bars else ""
    body += _table(("stage", "state", "seconds", "error / reason"), rows, num=(2,))
    if data.item_times:
        body += _drawn(plots.throughput, data.item_times)
    return _section("stages", "Stages", body)


def _facts(data: ReportData, stage: str) -> dict[str, Any]:
    for s in data.stages:
        if s.get("stage") == stage:
            return dict(s.get("facts") or {})
    return {}


def _devices(data: ReportData) -> str:
    facts = _facts(data, "device")
    cards = [c for c in facts.get("devices") or [] if isinstance(c, dict)]
    if cards:
        keys = tuple(dict.fromkeys(k for c in cards for k in c))
        body = _table(keys, [tuple(c.get(k) for k in keys) for c in cards])
    elif facts:
        body = _table(("fact", "value"), [(k, v) for k, v in facts.items()])
    else:
        body = '<p class="muted">The device stage recorded nothing.</p>'
    healthy = healthy_cards(data.stages)
    if healthy is not None:
        body += f"<p>Healthy cards: <b>{escape(_text(healthy))}</b></p>"
    return _section("devices", "Devices", body)


def _compute(data: ReportData) -> str:
    facts = _facts(data, "compute")
    pairs = [(name, float(facts[f"{key}_tflops"]), _num(facts.get(f"{key}_peak_tflops")))
             for key, name in (("bf16", "bf16"), ("fp32", "fp32"))
             if _num(facts.get(f"{key}_tflops")) is not None]
    body = _drawn(plots.bars_against, "Measured TFLOPS against the card's peak", pairs,
                  "TFLOPS") \
        if pairs else ""
    scalar = [(k, v) for k, v in facts.items() if not isinstance(v, (list, dict))]
    body += _table(("fact", "value"), scalar) if scalar else \
        '<p class="muted">No compute figures (the stage did not run or measured nothing).</p>'
    for key, value in facts.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            cols = tuple(dict.fromkeys(k for v in value for k in v))
            body += f"<p><b>{escape(key)}</b></p>" + _table(cols, [tuple(v.get(c) for c in cols)
                                                                    for v in value])
    return _section("compute", "Compute against the peak", body)


def _num(value: Any) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else None


def _memory(data: ReportData) -> str:
    facts = _facts(data, "memory")
    card = _num(data.run.plan.memory_per_card_gib if data.run.plan else None)
    pairs = [(k.replace("_gib", ""), float(facts[k]), card) for k in
             ("peak_allocated_gib", "peak_reserved_gib", "peak_rss_gib")
             if _num(facts.get(k)) is not None]
    body = _drawn(plots.bars_against, "Peak memory against the card", pairs, "GiB") \
        if pairs else ""
    scalar = [(k, v) for k, v in facts.items() if not isinstance(v, (list, dict))]
    body += _table(("fact", "value"), scalar) if scalar else \
        '<p class="muted">No memory figures (the stage did not run or was skipped).</p>'
    if card is None:
        body += '<p class="muted">No card memory in the catalog (a CPU run).</p>'
    return _section("memory", "Memory against the card", body)


def _balance(run: Run) -> str:
    bal = run.balance
    if not bal:
        return _section("balance", "Balance", '<p class="bad">No balance was produced.</p>')
    if bal.get("malformed"):  # the node's event did not type-check: never drawn
        recheck = bal.get("recheck") or {}
        body = ('<p class="bad">The runner\'s balance cannot be read, so it is not shown: '
                f'{escape("; ".join(map(str, bal["malformed"])))}. FAILS</p>')
        if recheck:
            body += ("<p>Recounted from the item events the bot recorded: "
                     f"{escape(_text(recheck.get('accepted')))} accepted + "
                     f"{escape(_text(recheck.get('refused')))} refused of "
                     f"{escape(_text(recheck.get('total')))} expected</p>")
        return _section("balance", "Balance", body)
    ok = bool(bal.get("ok"))
    accepted, refused = _count(bal.get("accepted")), _count(bal.get("refused"))
    body = (f'<p class="{"ok" if ok else "bad"}">{accepted} accepted + {refused} refused = '
            f'{accepted + refused} of {escape(_text(bal.get("total")))} expected: '
            f'{"holds" if ok else "FAILS"}</p>')
    if node_listed(run):
        body += f'<p class="note">Balance {escape(NODE_LISTED)}.</p>'
    by_cat = bal.get("by_category") or {}
    if by_cat:
        body += _table(("category", "items"),
                       sorted(by_cat.items(), key=lambda kv: str(kv[0]))[:REPORT_ROWS], num=(1,))
        body += _more(len(by_cat), f"balance.csv in the run directory {run.run_dir}")
    problems = [p for p in bal.get("problems") or [] if isinstance(p, dict)]
    if problems:
        body += f'<p class="bad">{len(problems)} problem(s)</p>' + _table(
            ("problem", "id", "detail"),
            [(p.get("kind"), p.get("id"), p.get("detail")) for p in problems[:REPORT_ROWS]])
        body += _more(len(problems), f"balance.json in the run directory {run.run_dir}")
    sample = [s for s in bal.get("sample") or [] if isinstance(s, dict) and s.get("id")]
    if sample:
        body += "<p><b>Sample review</b>: each result beside the beginning of its input</p>"
        body += _table(("id", "result", "input begins"),
                       [(s.get("id"), s.get("category") or s.get("reason"),
                         s.get("input_head") or s.get("excerpt") or "")
                        for s in sample[:REPORT_ROWS]])
        body += _more(len(sample), f"the balance event in events.jsonl of {run.run_dir}")
    return _section("balance", "Balance", body)


def _count(value: Any) -> int:
    """A count as an integer (a balance is type-checked where it is taken in; a record
    from before that check shows 0 rather than whatever it held)."""
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


def _resume(data: ReportData) -> str:
    facts = _facts(data, "pilot")
    a, b, c = (facts.get(k) for k in ("losses_a", "losses_b", "losses_c"))
    if not (isinstance(a, list) and isinstance(b, list)):
        return ""
    c = c if isinstance(c, list) else []
    same = facts.get("bit_identical")
    verdict = ("C continues A bit for bit" if same else
               "C differs from A" if same is False else "C was not run")
    body = (f'<p class="{"ok" if same else "bad"}">{escape(verdict)}</p>'
            + _drawn(lambda: plots.resume_losses([float(x) for x in a], [float(x) for x in b],
                                                 [float(x) for x in c])))
    return _section("resume", "Training: the resume comparison", body)


def _engine(data: ReportData) -> str:
    """A volume run's workers, pace per worker, and its stops and resumes."""
    engine = data.engine
    if engine is None:
        return ""
    workers = list(engine.get("workers") or [])
    nodes = {str(w.get("node") or w.get("where") or w.get("host")) for w in workers}
    items, work_s = int(engine.get("items") or 0), engine.get("work_s")
    rows: list[tuple[Any, ...]] = [
        ("Workers", f"{len(workers)} on {len(nodes)} node(s)" if workers else "none recorded"),
        ("Items recorded", items)]
    if workers and isinstance(work_s, (int, float)) and work_s > 0 and items:
        rows.append(("Throughput", f"{items / work_s:.3g} items/s in all, "
                                   f"{items / work_s / len(workers):.3g} items/s per worker "
                                   f"(over the work stage's {duration(float(work_s))}"
                                   + (f" in {engine['work_attempts']} attempts"
                                      if int(engine.get("work_attempts") or 1) > 1 else "")
                                   + ")"))
    body = _table(("", ""), rows)
    if workers:
        body += _table(("worker", "node", "cards"),
                       [(w.get("worker"), w.get("where") or w.get("host") or w.get("node"),
                         ",".join(str(c) for c in w.get("cards") or []) or "cpu")
                        for w in workers])
    body += _attempts(engine) + _engine_notes(engine.get("notes") or {})
    return _section("engine", "Volume engine: workers, pace, stops and resumes", body)


def _engine_notes(notes: dict[str, Any]) -> str:
    """The engine's notes as the terminal told them (excluded workers, splits, inputs
    refused alone...), the last ones when there were many."""
    shown = list(notes.get("shown") or [])
    if not shown:
        return ""
    earlier = int(notes.get("total") or len(shown)) - len(shown)
    head = (f'<p class="muted">{earlier} earlier note(s) in events.jsonl</p>'
            if earlier > 0 else "")
    return head + _table(("when", "what the engine did"), [(ts, text) for ts, text, _ in shown])


def _attempts(engine: dict[str, Any]) -> str:
    """Started, stopped and resumed, in time order; the latest stop with who and why."""
    lines = [(a.get("at"), "resumed" if a.get("resume") else "started", "")
             for a in engine.get("attempts") or []]
    lines += [(s.get("at"), "stopped", f"during stage {s.get('stage')}")
              for s in engine.get("stops") or []]
    stop = engine.get("stop") or {}
    if stop.get("by"):
        lines.append((stop.get("at"), "stop asked",
                      f"by {stop.get('by')}: {stop.get('reason')}"))
    if not lines:
        return ""
    return _table(("when", "what", "detail"), sorted(lines, key=lambda x: str(x[0])))


def _decisions(data: ReportData) -> str:
    launched = _launched(data)
    if not data.decisions:
        if launched:
            return _section("decisions", "Decision", launched)
        return _section("decisions", "Decisions",
                        '<p class="muted">No decision yet.</p>')
    rows = [(d.get("at"), d.get("decision"), d.get("by"),
             "recorded" if d.get("accepted") else "REFUSED",
             d.get("reason"), d.get("override_of") or ("yes" if d.get("override") else ""),
             d.get("refusal") or "", d.get("source")) for d in data.decisions]
    return _section("decisions", "Decisions (including refused attempts)",
                    _table(("when", "decision", "by", "result", "reason", "override of",
                            "refusal", "from"), rows) + launched)


def _launched(data: ReportData) -> str:
    """What launched this volume run, or the volume run this pilot's approval launched."""
    if data.volume_run:
        return ("<p>This approval launched the volume run "
                f"<code>{escape(data.volume_run)}</code>.</p>")
    by = data.launched_by
    if not by:
        return ""
    text = f"Launched by the approval of pilot <code>{escape(str(by.get('pilot')))}</code>"
    decision = by.get("decision")
    if decision:
        text += (f": {escape(str(decision.get('decision')))} by {escape(str(decision.get('by')))}"
                 f" at {escape(str(decision.get('at')))} ({escape(str(decision.get('reason')))})")
    return f"<p>{text}. A volume run has no decision of its own.</p>"


def _checksums(data: ReportData) -> str:
    if not data.checksums:
        return _section("checksums", "Checksums",
                        f'<p class="muted">{escape(data.checksums_from or "No checksums.")}</p>')
    shown = data.checksums[:REPORT_ROWS]
    total = max(data.checksums_total or 0, len(data.checksums))
    return _section("checksums", "Checksums (SHA-256)",
                    f'<p class="muted">{escape(data.checksums_from)}</p>'
                    + _table(("sha256", "file"), [(h, p) for h, p in shown])
                    + _more(total, data.checksums_rest or data.checksums_from, len(shown)))


def _more(total: int, where: str, shown: int = REPORT_ROWS) -> str:
    """The line under a table cut at ``shown`` rows: how many more, and where they are."""
    if total <= shown:
        return ""
    return (f'<p class="note">… and {total - shown} more: see {escape(where)}</p>')
