"""``report.html``: one self-contained page that tells a run's story, worth forwarding.

``render_report(ReportData) -> str`` is pure: the data comes from the store and the run
directory (``bot/service/report_files.py`` gathers and writes it). The page has no external asset
(inline CSS, inline SVG plots from ``bot.messages.plots``), opens offline and prints.
Each section carries an ``id`` (plan, forecast, stages, devices, compute, memory, balance,
decisions, checksums, and resume for a training pilot) so tests and readers can find it.
This module holds the run's story (verdict, plan, forecast, balance, decisions, checksums);
what the node measured is ``report_node.py``'s, the page's shared pieces ``report_page.py``'s.
"""

from __future__ import annotations

from html import escape

from bot.messages import plots
from bot.messages.forecast_view import check_rows, fit_line
from bot.messages.report_node import (
    compute_section,
    devices_section,
    engine_section,
    memory_section,
    stage_bars,
    stages_section,
)
from bot.messages.report_page import (
    CSP,
    CSS,
    REPORT_ROWS,
    ReportData,
    as_text,
    drawn,
    more,
    section,
    stage_facts,
    table,
)
from bot.pilot.balance_check import NODE_LISTED, node_listed
from bot.pilot.plan import format_usd
from bot.pilot.record import Run

__all__ = ["REPORT_ROWS", "ReportData", "render_report", "stage_bars"]


def render_report(data: ReportData) -> str:
    run = data.run
    sections = [_header(data), _plan(run), _forecast(data), stages_section(data),
                devices_section(data), compute_section(data), memory_section(data),
                _balance(run), _resume(data), engine_section(data), _decisions(data),
                _checksums(data)]
    title = f"Preflight report — {run.name} ({run.id})"
    return ("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body>"
            + "".join(s for s in sections if s) + "</body></html>\n")


def _header(data: ReportData) -> str:
    run = data.run
    verdict = run.verdict
    passed = verdict is not None and verdict.passed
    badge = (f'<span class="badge {"ok" if passed else "bad"}">'
             f'{"PASSED" if passed else "FAILED"}</span>' if verdict is not None else
             f'<span class="badge bad">{escape(str(run.status))}</span>')
    kind = "Volume run" if run.kind == "volume" else "Pilot"
    checks = "".join(f'<li class="{"warn" if c.warn else "ok" if c.ok else "bad"}">'
                     f'{c.mark} {escape(c.text)}</li>'
                     for c in (verdict.checks if verdict is not None else ()))
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
        return section("plan", "Plan", '<p class="muted">No plan was recorded.</p>')
    rows = [("GPU", plan.gpu), ("Lots", f"{plan.lots} × {plan.cards_per_lot}"
             f" card(s) = {plan.total_cards} cards"), ("Days", plan.days),
            ("Price per lot per day", f"{format_usd(plan.lot_price_usd_per_day)} USD"),
            ("Total", f"{format_usd(plan.total_usd)} USD"),
            ("Backend / preparation", f"{plan.backend} / {plan.preparation}"),
            ("Lease", f"{plan.starts_at or 'start not set'} → "
                      f"{plan.ends_at or '?'}")]
    body = table(("item", "value"), rows)
    body += f'<p class="formula">{escape(plan.formula)}</p>'
    body += "".join(f'<p class="muted">{escape(n)}</p>' for n in plan.notes)
    return section("plan", "Plan", body)


def _forecast(data: ReportData) -> str:
    fc = data.run.forecast
    if fc is None:
        return section("forecast", "Forecast of the volume",
                        '<p class="muted">No volume section: nothing to forecast.</p>')
    if fc.is_check:
        body = (table(("figure", "value"), check_rows(fc))
                + f'<p class="formula">{escape(fc.text("formula") or "")}</p>')
        parent = data.parent_forecast
        if parent is not None and parent.figures:
            body += "<p><b>The pilot's forecast</b>, as the approver saw it</p>" + table(
                ("figure", "value", "formula"),
                [(f.label, f.value, f.formula) for f in parent.figures])
        return section("forecast", "Forecast against the actual", body)
    if not fc.possible:
        return section("forecast", "Forecast of the volume",
                        f'<p class="note">No forecast: {escape(str(fc.reason))}</p>')
    cls = "ok" if fc.fits else "bad" if fc.fits is False else ""
    body = f'<p class="{cls}">{escape(fit_line(fc))}</p>'
    body += table(("figure", "value", "formula"),
                   [(f.label, f.value, f.formula) for f in fc.figures])
    body += "".join(f'<p class="note">{escape(n)}</p>' for n in fc.notes)
    if data.item_points and any(b for b, _ in data.item_points):
        body += drawn(plots.time_against_size, data.item_points, fc.values.get("fit"))
    return section("forecast", "Forecast of the volume", body)


def _balance(run: Run) -> str:
    bal = run.balance
    if bal is None:
        return section("balance", "Balance", '<p class="bad">No balance was produced.</p>')
    if bal.malformed:  # the node's event did not type-check: never drawn
        recheck = bal.recheck
        body = ('<p class="bad">The runner\'s balance cannot be read, so it is not shown: '
                f'{escape("; ".join(bal.malformed))}. FAILS</p>')
        if recheck is not None:
            body += ("<p>Recounted from the item events the bot recorded: "
                     f"{escape(as_text(recheck.accepted))} accepted + "
                     f"{escape(as_text(recheck.refused))} refused of "
                     f"{escape(as_text(recheck.total))} expected</p>")
        return section("balance", "Balance", body)
    accepted, refused = bal.accepted or 0, bal.refused or 0
    body = (f'<p class="{"ok" if bal.ok else "bad"}">{accepted} accepted + {refused} refused = '
            f'{accepted + refused} of {escape(as_text(bal.total))} expected: '
            f'{"holds" if bal.ok else "FAILS"}</p>')
    if node_listed(run):
        body += f'<p class="note">Balance {escape(NODE_LISTED)}.</p>'
    if bal.by_category:
        body += table(("category", "items"), list(bal.by_category[:REPORT_ROWS]), num=(1,))
        body += more(len(bal.by_category), f"balance.csv in the run directory {run.run_dir}")
    if bal.problems:
        body += f'<p class="bad">{len(bal.problems)} problem(s)</p>' + table(
            ("problem", "id", "detail"),
            [(p.kind, p.id, p.detail) for p in bal.problems[:REPORT_ROWS]])
        body += more(len(bal.problems), f"balance.json in the run directory {run.run_dir}")
    sample = [s for s in bal.sample if s.id]
    if sample:
        body += "<p><b>Sample review</b>: each result beside the beginning of its input</p>"
        body += table(("id", "result", "input begins"),
                       [(s.id, s.result, s.input_head) for s in sample[:REPORT_ROWS]])
        body += more(len(sample), f"the balance event in events.jsonl of {run.run_dir}")
    return section("balance", "Balance", body)


def _resume(data: ReportData) -> str:
    facts = stage_facts(data, "pilot")
    a, b, c = (facts.get(k) for k in ("losses_a", "losses_b", "losses_c"))
    if not (isinstance(a, list) and isinstance(b, list)):
        return ""
    c = c if isinstance(c, list) else []
    same = facts.get("bit_identical")
    verdict = ("C continues A bit for bit" if same else
               "C differs from A" if same is False else "C was not run")
    body = (f'<p class="{"ok" if same else "bad"}">{escape(verdict)}</p>'
            + drawn(lambda: plots.resume_losses([float(x) for x in a], [float(x) for x in b],
                                                 [float(x) for x in c])))
    return section("resume", "Training: the resume comparison", body)


def _decisions(data: ReportData) -> str:
    launched = _launched(data)
    if not data.decisions:
        if launched:
            return section("decisions", "Decision", launched)
        return section("decisions", "Decisions",
                        '<p class="muted">No decision yet.</p>')
    rows = [(d.get("at"), d.get("decision"), d.get("by"),
             "recorded" if d.get("accepted") else "REFUSED",
             d.get("reason"), d.get("override_of") or ("yes" if d.get("override") else ""),
             d.get("refusal") or "", d.get("source")) for d in data.decisions]
    return section("decisions", "Decisions (including refused attempts)",
                    table(("when", "decision", "by", "result", "reason", "override of",
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
        return section("checksums", "Checksums",
                        f'<p class="muted">{escape(data.checksums_from or "No checksums.")}</p>')
    shown = data.checksums[:REPORT_ROWS]
    total = max(data.checksums_total or 0, len(data.checksums))
    return section("checksums", "Checksums (SHA-256)",
                    f'<p class="muted">{escape(data.checksums_from)}</p>'
                    + table(("sha256", "file"), [(h, p) for h, p in shown])
                    + more(total, data.checksums_rest or data.checksums_from, len(shown)))
