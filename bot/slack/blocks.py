"""Neutral messages → Block Kit, inside Slack's limits.

Slack refuses a message with more than 50 blocks, a section text over 3,000 characters, a
header over 150 or more than 10 fields in a section. Everything rendered here is cut to
fit with a visible note, never refused: a big table is summarised and the full data goes
out as a file (``Attachment``), which the notifier uploads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from bot.messages.model import (
    Actions,
    Attachment,
    Block,
    Fields,
    Heading,
    Message,
    Progress,
    StageLine,
    Table,
    Text,
)
from bot.messages.progress import duration, progress_words

MAX_BLOCKS = 50
MAX_SECTION_TEXT = 3000
MAX_HEADER_TEXT = 150
MAX_FIELDS = 10
MAX_FIELD_TEXT = 2000
MAX_FALLBACK_TEXT = 3000

STAGE_MARK = {"pending": ":white_circle:", "running": ":hourglass_flowing_sand:",
              "passed": ":white_check_mark:", "failed": ":x:", "skipped": ":fast_forward:",
              "interrupted": ":octagonal_sign:"}
STYLE_MARK = {"plain": "", "ok": ":white_check_mark: ", "warn": ":warning: ",
              "error": ":x: ", "muted": ""}

SlackBlock = dict[str, Any]


@dataclass
class Rendered:
    """What one neutral message becomes: blocks, fallback text, files to upload."""

    blocks: list[SlackBlock]
    text: str
    attachments: list[Attachment] = field(default_factory=list)


def escape(text: str) -> str:
    """Slack's three control characters in message text (mrkdwn and plain alike)."""
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def unescape(text: str) -> str:
    """What Slack did to the text a user typed, undone (``&amp;`` last)."""
    return text.replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(message: Message) -> Rendered:
    blocks: list[SlackBlock] = []
    attachments: list[Attachment] = []
    stages: list[StageLine] = []
    for block in message.blocks:
        if isinstance(block, StageLine):
            stages.append(block)
            continue
        if stages:
            blocks.append(stage_section(stages))
            stages = []
        if isinstance(block, Attachment):
            attachments.append(block)
            blocks.append(context(f":paperclip: {block.title} is attached below in this thread."))
        else:
            blocks.extend(render_block(block))
    if stages:
        blocks.append(stage_section(stages))
    text = clip(escape(message.summary or message.key), MAX_FALLBACK_TEXT)
    return Rendered(fit_blocks(blocks), text, attachments)


def render_block(block: Block) -> list[SlackBlock]:
    if isinstance(block, Heading):
        return [{"type": "header",
                 "text": {"type": "plain_text", "text": clip(block.text, MAX_HEADER_TEXT) or " ",
                          "emoji": True}}]
    if isinstance(block, Text):
        if block.style == "muted":
            return [context(escape(block.text))]
        return [section(STYLE_MARK[block.style] + escape(block.text))]
    if isinstance(block, Fields):
        return fields_sections(block.pairs)
    if isinstance(block, Table):
        return [section(table_text(block))]
    if isinstance(block, Progress):
        return [section(progress_text(block))]
    if isinstance(block, Actions):
        return [actions(block)]
    return []


def section(text: str) -> SlackBlock:
    return {"type": "section",
            "text": {"type": "mrkdwn", "text": clip(text or " ", MAX_SECTION_TEXT)}}


def context(text: str) -> SlackBlock:
    return {"type": "context", "elements": [{"type": "mrkdwn", "text": clip(text or " ", 2000)}]}


def fields_sections(pairs: tuple[tuple[str, str], ...]) -> list[SlackBlock]:
    out: list[SlackBlock] = []
    for start in range(0, len(pairs), MAX_FIELDS):
        chunk = pairs[start:start + MAX_FIELDS]
        out.append({"type": "section", "fields": [
            {"type": "mrkdwn", "text": clip(f"*{escape(k)}*\n{escape(v)}", MAX_FIELD_TEXT)}
            for k, v in chunk]})
    return out


def stage_section(stages: list[StageLine]) -> SlackBlock:
    budget = (MAX_SECTION_TEXT - 20) // max(len(stages), 1)
    lines = []
    for s in stages:
        line = f"{STAGE_MARK.get(s.state, '')} *{escape(s.stage)}* {s.state}"
        if s.elapsed_s is not None:
            line += f" ({duration(s.elapsed_s)})"
        if s.detail:
            line += " — " + escape(s.detail)
        lines.append(clip(line, budget))
    return section("\n".join(lines))


def table_text(table: Table, limit: int = MAX_SECTION_TEXT) -> str:
    """A monospaced table that always fits one section; the rest is counted, not dropped."""
    widths = [len(c) for c in table.columns]
    cells = [tuple(clip(" ".join(str(c).split()), 60) for c in row) for row in table.rows]
    for row in cells:
        widths = [max(w, len(c)) for w, c in zip(widths, row)]

    def line(row: tuple[str, ...]) -> str:
        return "  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip()

    total = table.total_rows if table.total_rows is not None else len(cells)
    body = [line(table.columns)]
    room = limit - 120
    used = len(body[0])
    shown = 0
    for row in cells:
        text = line(row)
        if used + len(text) + 1 > room:
            break
        body.append(text)
        used += len(text) + 1
        shown += 1
    out = "```" + escape("\n".join(body)) + "```"
    if shown < total:
        out += f"\n_{shown} of {total} rows shown._"
    return clip(out, limit)


def progress_text(progress: Progress, width: int = 20) -> str:
    total = max(progress.total, 1)
    filled = min(width, round(width * progress.done / total))
    bar = f"`{'█' * filled}{'░' * (width - filled)}`"
    return f"{bar} {escape(progress_words(progress))}"


def actions(block: Actions) -> SlackBlock:
    elements = []
    for b in block.buttons[:25]:
        button: SlackBlock = {"type": "button", "action_id": f"preflight_{b.action}",
                              "text": {"type": "plain_text", "text": clip(b.label, 75)},
                              "value": clip(b.value, 2000)}
        if b.style in ("primary", "danger"):
            button["style"] = b.style
        elements.append(button)
    return {"type": "actions", "block_id": "preflight_decision", "elements": elements}


def fit_blocks(blocks: list[SlackBlock]) -> list[SlackBlock]:
    """At most 50 blocks: keep the first 48, say how many were left out, keep the last."""
    if len(blocks) <= MAX_BLOCKS:
        return blocks
    left_out = len(blocks) - (MAX_BLOCKS - 1)
    head = blocks[: MAX_BLOCKS - 2]
    return head + [context(f"_{left_out} more block(s) left out to fit Slack's limit._"),
                   blocks[-1]]
