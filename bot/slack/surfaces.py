"""Block Kit for what is not a pilot message: errors, help, modals, the App Home tab."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from bot.errors import Problem
from bot.pilot.leases import PROVISIONED, STATE_PATH
from bot.pilot.payloads import StoredForecast
from bot.pilot.record import Run, RunRecord
from bot.slack.blocks import clip, context, escape, fit_blocks, section

SUBMIT_CALLBACK = "preflight_submit"
DECIDE_CALLBACK = "preflight_decide"
MANIFEST_BLOCK = "manifest"
MANIFEST_FILE_BLOCK = "manifest_file"
REASON_BLOCK = "reason"
MAX_MODAL_INPUT = 3000

DECISION_LABELS = {"approve": "Approve scale-up", "fix-env": "Fix environment",
                   "revise": "Revise configuration", "stop": "Stop the run"}

HELP = """*Preflight* proves a rented GPU machine on a small pilot before the full job.
• Mention me with a manifest in a code block (```yaml … ```),
  or attach a `.yaml` / `.json` file to the mention.
• `/preflight submit` opens a form (paste the manifest, or attach a file for long ones).
• `/preflight run NAME` runs `manifests/NAME.yaml` from the bot host.
• `/preflight status [RUN]` · `/preflight runs` · `/preflight help`
• `/preflight stop RUN reason…` (or the Stop button of a running run) stops it;
  `preflight resume RUN` continues from its ledger.
• `/preflight lease [NODE [STATE [note]]]`: a rented node's lease (""" + STATE_PATH + """);
  runs need `""" + PROVISIONED + """`.
• In a pilot's thread: `@preflight approve <reason>`, `fix-env <reason>`,
  `revise <reason>`, or the buttons."""


def problems_blocks(title: str, problems: list[Problem]) -> list[dict[str, Any]]:
    lines = []
    for p in problems:
        where = p.loc or "(manifest)"
        if p.line is not None:
            where += f", line {p.line}" + (f", column {p.column}" if p.column else "")
        lines.append(f"• `{escape(where)}`: {escape(p.message)}")
    blocks = [section(f":x: *{escape(title)}* ({len(problems)} problem(s))")]
    chunk: list[str] = []
    for line in lines:
        if sum(len(x) + 1 for x in chunk) + len(line) > 2900:
            blocks.append(section("\n".join(chunk)))
            chunk = []
        chunk.append(clip(line, 2900))
    if chunk:
        blocks.append(section("\n".join(chunk)))
    blocks.append(context("Fix the manifest and post it again; nothing was started."))
    return fit_blocks(blocks)


def submit_modal(channel: str, response_url: str | None = None) -> dict[str, Any]:
    """The form; ``response_url`` (the command's) answers privately if the channel refuses."""
    return {
        "type": "modal", "callback_id": SUBMIT_CALLBACK,
        "title": {"type": "plain_text", "text": "Submit a pilot"},
        "submit": {"type": "plain_text", "text": "Submit"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "private_metadata": json.dumps({"channel": channel, "response_url": response_url}),
        "blocks": [
            {"type": "input", "block_id": MANIFEST_BLOCK, "optional": True,
             "label": {"type": "plain_text", "text": "Manifest (YAML or JSON)"},
             "hint": {"type": "plain_text", "text": "Up to 3,000 characters; attach a file "
                                                    "below for a longer manifest."},
             "element": {"type": "plain_text_input", "action_id": "value", "multiline": True,
                         "max_length": MAX_MODAL_INPUT}},
            {"type": "input", "block_id": MANIFEST_FILE_BLOCK, "optional": True,
             "label": {"type": "plain_text", "text": "…or a manifest file"},
             "element": {"type": "file_input", "action_id": "value",
                         "filetypes": ["yaml", "yml", "json"], "max_files": 1}},
        ],
    }


def decide_modal(run_id: str, decision: str, channel: str, thread_ts: str | None,
                 forecast: StoredForecast | None = None,
                 spend: list[str] | None = None) -> dict[str, Any]:
    """``spend``: what approving launches (bot.messages.targets.spend_lines)."""
    label = DECISION_LABELS.get(decision, decision)
    hint = {"approve": "Approving a failed pilot needs the word `override` and why.",
            "stop": "Stops the runner and all it started; finished items are kept."}.get(
        decision, "Recorded with your name and the time.")
    if decision == "approve" and forecast is not None and forecast.fits is False:
        hint = ("The volume's high estimate ends after the lease: approving needs the word "
                "`override` and why.")
    shown = forecast_blocks(forecast) if decision == "approve" else []
    if decision == "approve" and spend:
        shown.insert(0, section(clip("*Approving launches the volume on:*\n" + "\n".join(
            f"• {escape(line)}" for line in spend), 2900)))
    return {
        "type": "modal", "callback_id": DECIDE_CALLBACK,
        "title": {"type": "plain_text", "text": clip(label, 24)},
        "submit": {"type": "plain_text", "text": "Record"},
        "close": {"type": "plain_text", "text": "Cancel"},
        "private_metadata": json.dumps({"run": run_id, "decision": decision,
                                        "channel": channel, "thread_ts": thread_ts}),
        "blocks": [
            section(f"*{escape(label)}* for run `{escape(run_id)}`"),
            *shown,
            {"type": "input", "block_id": REASON_BLOCK,
             "label": {"type": "plain_text", "text": "Reason (required)"},
             "hint": {"type": "plain_text", "text": hint},
             "element": {"type": "plain_text_input", "action_id": "value", "multiline": True,
                         "min_length": 1, "max_length": 2000}},
        ],
    }


def forecast_blocks(forecast: StoredForecast | None) -> list[dict[str, Any]]:
    """The volume's forecast in the Approve modal: the verdict line and the key figures."""
    if forecast is None:
        return []
    if not forecast.possible:
        return [context(f"No forecast of the volume: {escape(str(forecast.reason))}")]
    from bot.messages.forecast_view import fit_line

    fits = forecast.fits
    mark = ":white_check_mark:" if fits is True else ":warning:" if fits is False else ""
    lines = [f"{mark} *{escape(fit_line(forecast))}*"]
    for fig in forecast.figures:
        if fig.key in ("workers", "setup", "wall", "finish", "lease_end", "margin",
                       "share", "cost"):
            lines.append(f"• {escape(fig.label)}: *{escape(fig.value)}* "
                         f"— {escape(fig.formula)}")
    lines += [f"• _{escape(note)}_" for note in forecast.notes]
    return [section(clip("\n".join(lines), 2900))]


def run_line(run: RunRecord) -> str:
    stage = run.stage_reached or "-"
    outcome = f", {run.outcome}" if run.outcome else ""
    return (f"`{escape(run.id)}` *{escape(run.name)}* — {escape(run.status)}{outcome},"
            f" stage {escape(stage)}")


def runs_blocks(runs: Sequence[RunRecord]) -> list[dict[str, Any]]:
    if not runs:
        return [section("No runs yet. `/preflight help` says how to start one.")]
    lines = [run_line(r) for r in runs[:30]]
    return [section(clip("\n".join(lines), 2990))]


def status_blocks(run: Run, stages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    blocks = [section(run_line(run))]
    for stage in stages:
        blocks.append(context(f"{escape(stage['stage'])}: {escape(stage['state'])}"))
    err = run.first_error
    if err:
        blocks.append(section(f":x: first error at *{escape(str(err.get('stage')))}*: "
                              f"{escape(str(err.get('message', '')))}"))
    return fit_blocks(blocks)


def home_view(active: Sequence[RunRecord], decisions: list[dict[str, Any]]) -> dict[str, Any]:
    blocks: list[dict[str, Any]] = [
        {"type": "header", "text": {"type": "plain_text", "text": "Preflight"}},
        section("*Active pilots*"),
    ]
    if active:
        blocks.extend(section(clip(run_line(r), 2990)) for r in active[:20])
    else:
        blocks.append(context("No pilot is running or awaiting a decision."))
    blocks.append({"type": "divider"})
    blocks.append(section("*Recent decisions*"))
    if decisions:
        for d in decisions[:20]:
            state = "" if d.get("accepted") else " (refused)"
            over = " override" if d.get("override") else ""
            blocks.append(context(clip(
                f"{escape(d['at'])} · <@{escape(d['by'])}> · *{escape(d['decision'])}*{over}{state}"
                f" · `{escape(d['run'])}` · {escape(d['reason'])}", 2000)))
    else:
        blocks.append(context("No decision recorded yet."))
    return {"type": "home", "blocks": blocks[:100]}  # a Home tab holds up to 100 blocks
