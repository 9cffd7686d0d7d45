"""Builds the neutral messages of a pilot thread from what the store recorded.

Each function returns one ``Message``; its ``key`` says which visible message it replaces.
Transports render them (bot/render.py for the terminal, bot/slack/blocks.py for Slack).
"""

from __future__ import annotations

from typing import Any

from bot.messages.model import (
    Actions,
    Attachment,
    Button,
    Fields,
    Heading,
    Message,
    Progress,
    StageLine,
    Table,
    Text,
)
from bot.messages.progress import epoch, seconds_between
from bot.messages.targets import spend_pairs
from bot.pilot.balance_check import NODE_LISTED, node_listed
from bot.pilot.payloads import Balance
from bot.pilot.plan import describe_lots, describe_price, format_usd, plural
from bot.pilot.record import Run, RunRecord
from bot.pilot.states import ENDED, S
from runner.events import OPTIONAL_STAGES, STAGES

MAX_TABLE_ROWS = 40

# The facts worth one glance, per stage; the rest is in environment.json / `preflight show`.
KEY_FACTS: dict[str, tuple[str, ...]] = {
    "prepare": ("free_disk_gib",),
    "interpreter": ("version", "executable"),
    # preparation: blender adds Blender's version, Cycles' device, render times, device peak
    "environment": ("checked", "missing", "mismatched", "version"),
    "torch": ("version", "build", "cuda", "hip"),
    "device": ("count", "name", "names", "memory_gib", "ram_gib", "cycles_device", "devices"),
    "compute": ("bf16_tflops", "fp32_tflops", "bf16_fraction_of_peak", "max_abs_error",
                "render_seconds", "cpu_ratio"),
    "interconnect": ("busbw_gbps", "library", "healthy_cards"),
    "extensions": ("passed", "failed"),
    "memory": ("peak_allocated_gib", "peak_reserved_gib", "peak_rss_gib", "budget_gib",
               "peak_device_mib"),
    "pilot": ("done", "total", "accepted", "refused"),
    "collect": ("nodes", "files", "bytes", "present_files"),
    "balance": ("accepted", "refused", "total", "ok"),
    "evidence": ("dest", "files", "verified"),
}


def plan_message(run: Run) -> Message:
    plan = run.plan
    if plan is None:  # a run recorded without one
        return Message(run.id, "plan", (Heading(f"Plan for {run.name}"),
                                        Text("No plan was recorded for this run.")),
                       summary=f"Plan {run.name}: none recorded")
    pairs = [
        ("Pilot", f"{run.name} (attempt {run.attempt}, run {run.id})"),
        ("GPU model", plan.gpu),
        ("Backend / preparation", f"{plan.backend} / {plan.preparation}"),
        ("Duration", plural(plan.days, "day")),
        ("Lots", describe_lots(plan.lots, plan.cards_per_lot, plan.total_cards)),
        ("Price per lot per day", describe_price(format_usd(plan.lot_price_usd_per_day),
                                                 plan.gpu, plan.cards_per_lot)),
        ("Total", f"{format_usd(plan.total_usd)} USD"),
        ("Formula", plan.formula),
    ]
    if plan.memory_per_card_gib is not None:
        pairs.append(("Memory per card", f"{plan.memory_per_card_gib} GiB"))
    if plan.volume:
        pairs.append(("Volume (on approval)", plan.volume))
    if plan.fetch:
        pairs.append(("Results fetch (caps)", plan.fetch))
    blocks: list[Any] = [Heading(f"Plan for {run.name}"), Fields(tuple(pairs))]
    for note in plan.notes:
        blocks.append(Text(note, style="muted"))
    changes = run.changes
    if changes:
        rows = tuple((str(c.get("path")), _short(c.get("old")), _short(c.get("new")))
                     for c in changes)
        blocks.append(Text(f"Changed since the previous attempt ({len(changes)} field(s)):"))
        blocks.append(Table(("field", "before", "now"), rows[:MAX_TABLE_ROWS], len(rows)))
        moved = [str(c.get("path")) for c in changes if c.get("factor")]
        if len(moved) > 1:
            blocks.append(Text(f"{len(moved)} factors changed at once ({', '.join(moved)}): "
                               "change one factor at a time, or a failure cannot be traced "
                               "to its cause.", style="warn"))
    return Message(run.id, "plan", tuple(blocks),
                   summary=f"Plan {run.name}: {format_usd(plan.total_usd)} USD")


def status_message(run: Run, stages: list[dict[str, Any]],
                   progress: tuple[int, int] | Progress | None = None) -> Message:
    by_name = {s["stage"]: s for s in stages}
    title = "Diagnostics and pilot" if run.kind == "pilot" else "Volume run"
    lines: list[Any] = [Heading(f"{title} — {run.name} ({_state_word(run)})")]
    for name in STAGES:
        row = by_name.get(name)
        if row is None and name in OPTIONAL_STAGES and not (
                run.status == S.RUNNING and _calibrates(run)):
            continue  # no part of this run (or of the runner that ran it)
        if row is None:
            lines.append(StageLine(name, "pending"))
            continue
        lines.append(_stage_line(row))
    if isinstance(progress, tuple):
        progress = Progress(*progress)
    if progress is not None and progress.total:
        lines.append(progress)
    if run.status == S.RUNNING:
        lines.append(Actions((Button("stop", "Stop the run", run.id, "danger"),)))
    return Message(run.id, "status", tuple(lines),
                   summary=f"{run.name}: {_state_word(run)}")


def _calibrates(run: Run) -> bool:
    """Whether this run has a ``calibrate`` stage: a pilot with a volume, a handler, and
    ``volume.calibrate`` not false (bot/pilot/specbuild.py's rule)."""
    m = run.manifest
    return (run.kind == "pilot" and m is not None and m.volume is not None
            and m.volume.calibrate and bool(m.task.handler) and not m.task.command
            and m.task.kind != "train" and m.preparation != "blender")


def _stage_line(row: dict[str, Any]) -> StageLine:
    """A stage with its elapsed time: finished ones their duration, a running one its start."""
    started, ended = row.get("started_at"), row.get("ended_at")
    if row["state"] == "running":
        return StageLine(row["stage"], "running", stage_detail(row), started=epoch(started))
    return StageLine(row["stage"], row["state"], stage_detail(row),
                     elapsed_s=seconds_between(started, ended))


def stage_detail(row: dict[str, Any]) -> str:
    if row["state"] == "failed" and row.get("error"):
        return error_text(row["error"])
    if row["state"] == "skipped":
        return str(row.get("reason") or "")
    if row["state"] == "interrupted":
        return "the runner died during this stage (see the first error)"
    facts = row.get("facts") or {}
    keys = KEY_FACTS.get(row["stage"], ())
    parts = [f"{k}={_fmt(facts[k])}" for k in keys if k in facts and facts[k] not in (None, [], {})]
    if not parts:
        parts = [f"{k}={_fmt(v)}" for k, v in list(facts.items())[:3]
                 if isinstance(v, (str, int, float, bool))]
    proven = facts.get("proven_by")
    if isinstance(proven, dict):  # a volume's head: taken from its card proof, not run again
        parts.append(f"from this node's card proof at {proven.get('at') or '?'}")
    return ", ".join(parts)


def error_text(err: dict[str, Any]) -> str:
    """``Type: message``, without repeating a type the message already names."""
    etype, message = str(err.get("type") or "Error"), str(err.get("message") or "")
    return message if message.startswith(etype) or f"{etype}:" in message \
        else f"{etype}: {message}"


def first_error_message(run: Run) -> Message | None:
    err = run.first_error
    if not err:
        return None
    pairs = [("Stage reached", str(err.get("stage"))),
             ("Error", error_text(err))]
    if run.stop is not None:
        pairs.insert(0, ("Stopped by", run.stop.told().removeprefix("by ")))
    if err.get("where"):
        pairs.append(("Where", str(err["where"])))
    if err.get("hint"):
        pairs.append(("Hint", str(err["hint"])))
    return Message(run.id, "first_error",
                   (Heading("First error"), Fields(tuple(pairs))),
                   summary=f"{run.name}: first error at stage {err.get('stage')}")


def balance_message(run: Run, csv_path: str | None = None) -> Message | None:
    bal = run.balance
    if bal is None:
        return None
    if bal.malformed:
        return _malformed_balance(run, bal)
    blocks: list[Any] = [
        Heading("Balance"),
        Fields((("Accepted", str(bal.accepted)), ("Refused", str(bal.refused)),
                ("Expected", str(bal.total)),
                ("Check", "accepted + refused = expected" if bal.ok else "FAILED"))),
    ]
    if node_listed(run):
        blocks.append(Text(f"Balance {NODE_LISTED}."))
    if bal.by_category:
        counts = ", ".join(f"{k} {v}" for k, v in bal.by_category)
        blocks.append(Text(f"By category: {counts}"))
    if bal.problems:
        rows = tuple((p.kind, p.id, p.detail) for p in bal.problems)
        blocks.append(Text(f"{len(rows)} problem(s):", style="error"))
        blocks.append(Table(("problem", "id", "detail"), rows[:MAX_TABLE_ROWS], len(rows)))
    if bal.items:
        rows = tuple((i.id, i.status, i.result) for i in bal.items[:MAX_TABLE_ROWS])
        # items: the first rows only
        blocks.append(Table(("id", "status", "category / reason"), rows, bal.rows))
    if bal.sample:
        rows = tuple((s.id, s.result, _short(s.input_head, 80)) for s in bal.sample)
        blocks.append(Text("Sample review — check these results against their inputs:"))
        blocks.append(Table(("id", "result", "input begins"), rows[:MAX_TABLE_ROWS], len(rows)))
    if run.items_pruned_at:
        blocks.append(Text(
            f"Item rows pruned from the state database on {run.items_pruned_at[:10]} "
            f"(retention); the full balance, one row per input: "
            f"{csv_path or run.run_dir / 'balance.csv'}"))
    if csv_path and bal.rows > MAX_TABLE_ROWS:
        blocks.append(Attachment(csv_path, "balance.csv"))
    return Message(run.id, "balance", tuple(blocks),
                   summary=f"Balance {bal.accepted} accepted + {bal.refused} refused"
                           f" of {bal.total}: {'ok' if bal.ok else 'FAILED'}")


def _malformed_balance(run: Run, bal: Balance) -> Message:
    """A balance whose event did not type-check: the flag and the bot's own recount, none
    of the node's figures."""
    recheck = bal.recheck
    blocks: list[Any] = [
        Heading("Balance"),
        Text("The runner's balance cannot be read, so it is not shown: "
             + "; ".join(bal.malformed), style="error")]
    if recheck is not None:
        blocks.append(Text(f"Recounted from the item events the bot recorded: "
                           f"{recheck.accepted} accepted + {recheck.refused} "
                           f"refused of {recheck.total} expected"))
    return Message(run.id, "balance", tuple(blocks),
                   summary="Balance: the runner's balance cannot be read: FAILED")


def evidence_message(run: Run) -> Message | None:
    ev = run.evidence
    if ev is None:
        return None
    said = ("as claimed by the node (not checked by the bot host)"
            if ev.verified and ev.verified_by == "node" else "yes" if ev.verified else "NO")
    files = str(ev.files) + (f" (the outputs in {ev.shards} shards, docs/evidence.md)"
                             if ev.shards else "")
    pairs = [("Copied to", str(ev.dest)), ("Files", files),
             ("Bytes", "?" if ev.bytes is None else str(ev.bytes)), ("Verified", said)]
    if ev.node_dest:
        pairs.insert(1, ("Node's copy", ev.node_dest))
    # why the bot did not take the node's word: the fetch refused, or a claimed dest
    why = tuple(Text(text, style="error")
                for text in (ev.fetch_error, ev.dest_refused, ev.malformed) if text)
    return Message(run.id, "evidence", (Heading("Evidence copy"), Fields(tuple(pairs)),
                                           *why),
                   summary=f"Evidence {'verified' if ev.verified else 'NOT verified'} "
                           f"at {ev.dest}")


def verdict_message(run: Run) -> Message:
    passed = run.verdict is not None and run.verdict.passed
    blocks: list[Any] = [Heading("Verdict: " + ("PASSED" if passed else "FAILED"))]
    for check in run.verdict.checks if run.verdict is not None else ():
        blocks.append(Text(f"{check.mark} {check.text}", style=check.style))
    return Message(run.id, "verdict", tuple(blocks),
                   summary=f"{run.name}: pilot {'passed' if passed else 'failed'}")


def decision_message(run: Run, decisions: list[dict[str, Any]]) -> Message:
    if run.kind != "pilot":
        return _volume_decision(run)
    if run.status == S.STOPPED:
        who = f" {run.stop.told()}" if run.stop is not None and run.stop.by else ""
        then = (_PRUNED_NO_RESUME if run.items_pruned_at else
                f"Nothing to decide yet: `preflight resume {run.id}` continues it from its "
                "ledger.")
        return Message(run.id, "decision", (Heading("Decision"), Text(
            f"The run was stopped{who}. {then}")), summary=f"{run.name}: stopped")
    accepted = [d for d in decisions if d.get("accepted")]
    if accepted:
        d = accepted[-1]
        label = {"approve": "Scale-up approved", "fix-env": "Fix the environment",
                 "revise": "Revise the configuration"}.get(d["decision"], d["decision"])
        over = ""
        if d.get("override"):
            what = d.get("override_of") or "the pilot failed"
            over = (" (override of a failed pilot)" if what == "the pilot failed"
                    else f" (override: {what})")
        pairs = [("By", d["by"]), ("When", d["at"]), ("Reason", d["reason"])]
        if run.volume_run:
            pairs.append(("Volume run", str(run.volume_run)))
        elif d["decision"] == "approve" and run.manifest is not None \
                and run.manifest.volume is None:
            pairs.append(("Volume", "nothing launched: the manifest has no volume section "
                                    "(docs/volume.md); add one and submit a new attempt to "
                                    "run the full corpus"))
        return Message(run.id, "decision",
                       (Heading(f"Decision: {label}{over}"), Fields(tuple(pairs)),
                        *_refused(decisions)),
                       summary=f"{run.name}: {label} by {d['by']}")
    buttons = (Button("approve", "Approve scale-up", run.id, "primary"),
               Button("fix-env", "Fix environment", run.id, "danger"),
               Button("revise", "Revise configuration", run.id))
    spend = spend_pairs(run)  # what an approval launches: nodes, cards, hosts
    return Message(run.id, "decision",
                   (Heading("Decision"), Text("Launch the volume, fix the environment, or revise "
                                              "the configuration. A reason is required."),
                    *((Text("Approving launches the volume on:"), Fields(tuple(spend)))
                      if spend else ()),
                    *_refused(decisions), Actions(buttons), Text(who_may_approve(run))),
                   summary=f"{run.name}: awaiting a decision")


def who_may_approve(run: Run) -> str:
    """Who ``--by NAME`` may be for an approval (approvals.approvers; with two_person, not
    the submitter): the hint named NAME without saying whose name."""
    if not run.approvers:
        return ("Nobody may approve: approvals.approvers lists no one (list them and "
                "submit again)")
    text = f"Who may approve (--by): {', '.join(run.approvers)} (approvals.approvers)"
    if run.two_person and run.submitter:
        text += f"; two_person: not {run.submitter}, who submitted it"
    return text


def _refused(decisions: list[dict[str, Any]], shown: int = 10) -> tuple[Any, ...]:
    """The refused attempts (recorded with why), newest last: the thread shows them too."""
    refused = [d for d in decisions if not d.get("accepted")]
    if not refused:
        return ()
    rows = tuple((str(d.get("decision")), str(d.get("by")), str(d.get("at")),
                  _short(d.get("refusal"), 120)) for d in refused[-shown:])
    return (Text(f"{len(refused)} refused attempt(s):", style="warn"),
            Table(("decision", "by", "when", "refused because"), rows, len(refused)))


# a run whose item rows retention pruned (bot.pilot.states.resume_refusal says why)
_PRUNED_NO_RESUME = ("Its item rows were pruned (retention): it can no longer be resumed; "
                     "submit the manifest again for a new attempt.")


def _volume_decision(run: Run) -> Message:
    """A volume run has no decision: the pilot's approval launched it, once."""
    text = (f"Nothing to decide: this is the full run that the approval of pilot "
            f"{run.parent_run} launched.")
    if run.items_pruned_at:
        text += f" {_PRUNED_NO_RESUME}"
    elif run.outcome == "failed" or run.status == S.STOPPED:
        text += f" `preflight resume {run.id}` runs the items its ledger lacks."
    return Message(run.id, "decision", (Heading("Volume run"), Text(text)),
                   summary=f"{run.name}: volume run {_state_word(run)}")


def lease_refused(run: RunRecord) -> bool:
    """A planned run its node's lease kept from starting (the refusal is its first error)."""
    err = run.first_error if isinstance(run, Run) else None
    return run.status == S.PLANNED and bool(err) and (err or {}).get("stage") == "lease"


def _state_word(run: Run) -> str:
    if run.status == S.STOPPED:
        return str(S.STOPPED)
    if run.status in ENDED - {S.STOPPED}:
        return "passed" if run.outcome == "passed" else "failed"
    status = str(run.status)
    if lease_refused(run):
        return "refused (lease)"
    words: dict[str, str] = {S.PLANNED: "planned", S.DISPATCHING: "starting",
                             S.RUNNING: "running", S.DISPATCH_FAILED: "could not start"}
    return words.get(status, status)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.3g}"
    if isinstance(value, list):
        return ",".join(str(v) for v in value[:4]) + ("…" if len(value) > 4 else "")
    return str(value)


def _short(value: Any, limit: int = 60) -> str:
    text = "" if value is None else str(value)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
