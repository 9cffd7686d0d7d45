"""The report's sections of what the node measured: the stages and their timeline, the
devices, compute and memory against the card, and a volume run's engine (workers, pace,
stops and resumes). Each takes the page's ``ReportData`` and returns its ``<section>``."""

from __future__ import annotations

from html import escape
from typing import Any

from bot.messages import plots
from bot.messages.report_page import (
    ReportData,
    as_text,
    drawn,
    num,
    section,
    stage_facts,
    table,
)
from bot.pilot.cards import healthy_cards
from bot.pilot.clock import read_time
from bot.pilot.forecast import duration
from bot.pilot.record import StopNote


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


def stages_section(data: ReportData) -> str:
    bars = stage_bars(data.stages)
    rows = []
    for s in data.stages:
        b, e = read_time(s.get("started_at")), read_time(s.get("ended_at"))
        length = f"{(e - b).total_seconds():.3f}" if b and e else ""
        detail = (s.get("error") or {}).get("message") if s.get("error") else s.get("reason")
        rows.append((s["stage"], s.get("state"), length, detail or ""))
    body = drawn(plots.stage_timeline, bars) if bars else ""
    body += table(("stage", "state", "seconds", "error / reason"), rows, num=(2,))
    if data.item_times:
        body += drawn(plots.throughput, data.item_times)
    return section("stages", "Stages", body)


def devices_section(data: ReportData) -> str:
    facts = stage_facts(data, "device")
    cards = [c for c in facts.get("devices") or [] if isinstance(c, dict)]
    if cards:
        keys = tuple(dict.fromkeys(k for c in cards for k in c))
        body = table(keys, [tuple(c.get(k) for k in keys) for c in cards])
    elif facts:
        body = table(("fact", "value"), [(k, v) for k, v in facts.items()])
    else:
        body = '<p class="muted">The device stage recorded nothing.</p>'
    healthy = healthy_cards(data.stages)
    if healthy is not None:
        body += f"<p>Healthy cards: <b>{escape(as_text(healthy))}</b></p>"
    return section("devices", "Devices", body)


def compute_section(data: ReportData) -> str:
    facts = stage_facts(data, "compute")
    pairs = [(name, float(facts[f"{key}_tflops"]), num(facts.get(f"{key}_peak_tflops")))
             for key, name in (("bf16", "bf16"), ("fp32", "fp32"))
             if num(facts.get(f"{key}_tflops")) is not None]
    body = drawn(plots.bars_against, "Measured TFLOPS against the card's peak", pairs,
                  "TFLOPS") \
        if pairs else ""
    scalar = [(k, v) for k, v in facts.items() if not isinstance(v, (list, dict))]
    body += table(("fact", "value"), scalar) if scalar else \
        '<p class="muted">No compute figures (the stage did not run or measured nothing).</p>'
    for key, value in facts.items():
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            cols = tuple(dict.fromkeys(k for v in value for k in v))
            body += f"<p><b>{escape(key)}</b></p>" + table(cols, [tuple(v.get(c) for c in cols)
                                                                    for v in value])
    return section("compute", "Compute against the peak", body)


def memory_section(data: ReportData) -> str:
    facts = stage_facts(data, "memory")
    card = num(data.run.plan.memory_per_card_gib if data.run.plan else None)
    pairs = [(k.replace("_gib", ""), float(facts[k]), card) for k in
             ("peak_allocated_gib", "peak_reserved_gib", "peak_rss_gib")
             if num(facts.get(k)) is not None]
    body = drawn(plots.bars_against, "Peak memory against the card", pairs, "GiB") \
        if pairs else ""
    scalar = [(k, v) for k, v in facts.items() if not isinstance(v, (list, dict))]
    body += table(("fact", "value"), scalar) if scalar else \
        '<p class="muted">No memory figures (the stage did not run or was skipped).</p>'
    if card is None:
        body += '<p class="muted">No card memory in the catalog (a CPU run).</p>'
    return section("memory", "Memory against the card", body)


def engine_section(data: ReportData) -> str:
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
    body = table(("", ""), rows)
    if workers:
        body += table(("worker", "node", "cards"),
                       [(w.get("worker"), w.get("where") or w.get("host") or w.get("node"),
                         ",".join(str(c) for c in w.get("cards") or []) or "cpu")
                        for w in workers])
    body += _attempts(engine) + _engine_notes(engine.get("notes") or {})
    return section("engine", "Volume engine: workers, pace, stops and resumes", body)


def _engine_notes(notes: dict[str, Any]) -> str:
    """The engine's notes as the terminal told them (excluded workers, splits, inputs
    refused alone...), the last ones when there were many."""
    shown = list(notes.get("shown") or [])
    if not shown:
        return ""
    earlier = int(notes.get("total") or len(shown)) - len(shown)
    head = (f'<p class="muted">{earlier} earlier note(s) in events.jsonl</p>'
            if earlier > 0 else "")
    return head + table(("when", "what the engine did"), [(ts, text) for ts, text, _ in shown])


def _attempts(engine: dict[str, Any]) -> str:
    """Started, stopped and resumed, in time order; the latest stop with who and why."""
    lines = [(a.get("at"), "resumed" if a.get("resume") else "started", "")
             for a in engine.get("attempts") or []]
    lines += [(s.get("at"), "stopped", f"during stage {s.get('stage')}")
              for s in engine.get("stops") or []]
    stop = engine.get("stop")
    if isinstance(stop, StopNote) and stop.by:
        lines.append((stop.at, "stop asked", f"by {stop.by}: {stop.reason}"))
    if not lines:
        return ""
    return table(("when", "what", "detail"), sorted(lines, key=lambda x: str(x[0])))
