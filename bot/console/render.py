"""Renders the neutral message model for the terminal: rich renderables and plain text."""

from __future__ import annotations

import time

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table as RichTable
from rich.text import Text as RichText

from bot.messages.model import (
    Actions,
    Attachment,
    Block,
    Button,
    Fields,
    Heading,
    Message,
    Progress,
    StageLine,
    Table,
    Text,
)
from bot.messages.progress import duration, progress_words

STATE_MARK = {"pending": "·", "running": "…", "passed": "✓", "failed": "✗", "skipped": "–",
              "interrupted": "!"}
STATE_STYLE = {"pending": "dim", "running": "yellow", "passed": "green", "failed": "bold red",
               "skipped": "dim", "interrupted": "bold red"}
TEXT_STYLE = {"plain": "", "ok": "green", "warn": "yellow", "error": "red", "muted": "dim"}


def to_rich(message: Message, now: float | None = None) -> RenderableType:
    """``now`` (epoch seconds) gives a running stage its elapsed time so far."""
    title = None
    parts: list[RenderableType] = []
    stage_rows: list[StageLine] = []
    for block in message.blocks:
        if isinstance(block, Heading) and title is None:
            title = block.text
        elif isinstance(block, StageLine):
            stage_rows.append(block)
        else:
            parts.append(_block_rich(block))
    if stage_rows:
        parts.insert(0, _stages_table(stage_rows, now))
    border = {"first_error": "red", "verdict": "green" if "PASSED" in (title or "") else "red",
              "plan": "blue", "decision": "magenta"}.get(message.key, "white")
    return Panel(Group(*parts), title=title, title_align="left", border_style=border)


def _stages_table(rows: list[StageLine], now: float | None) -> RichTable:
    table = RichTable.grid(padding=(0, 1))
    table.add_column(width=1)
    table.add_column(min_width=12)
    table.add_column(justify="right", min_width=8)
    table.add_column(overflow="fold")
    for row in rows:
        style = STATE_STYLE[row.state]
        elapsed = stage_elapsed(row, now)
        table.add_row(RichText(STATE_MARK[row.state], style=style),
                      RichText(row.stage, style=style),
                      RichText(duration(elapsed) if elapsed is not None else "", style="dim"),
                      RichText(row.detail))
    return table


def stage_elapsed(row: StageLine, now: float | None) -> float | None:
    """A finished stage's duration; a running one's time so far (given ``now``)."""
    if row.state == "running" and row.started is not None:
        return max(0.0, (now if now is not None else time.time()) - row.started)
    return row.elapsed_s


def _block_rich(block: Block) -> RenderableType:
    if isinstance(block, Heading):
        return RichText(block.text, style="bold")
    if isinstance(block, Text):
        return RichText(block.text, style=TEXT_STYLE[block.style])
    if isinstance(block, Fields):
        grid = RichTable.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column(overflow="fold")
        for label, value in block.pairs:
            grid.add_row(label, value)
        return grid
    if isinstance(block, Table):
        table = RichTable(*block.columns, show_lines=False, header_style="bold")
        for row in block.rows:
            table.add_row(*row)
        if block.total_rows and block.total_rows > len(block.rows):
            table.caption = f"{len(block.rows)} of {block.total_rows} rows shown"
        return table
    if isinstance(block, Progress):
        return Group(RichText(progress_words(block)),
                     ProgressBar(total=max(block.total, 1), completed=block.done, width=40))
    if isinstance(block, Actions):
        # Each command on a line of its own, the panel's whole width: typed back by the
        # user, it is never cut, nor an id folded (a label beside it left it ~20 columns
        # short at 80); wider than the panel, it wraps at its spaces only.
        lines: list[RenderableType] = []
        for button in block.buttons:
            lines += [RichText(button.label, style="bold"),
                      RichText("  " + button_command(button), style="magenta")]
        return Group(*lines)
    if isinstance(block, Attachment):
        return RichText(f"attached: {block.title} ({block.path})", style="dim")
    raise TypeError(f"unknown block {block!r}")


def button_command(button: Button) -> str:
    """What a person types in the terminal for what the chat offers as a button."""
    if button.action == "stop":
        return f'preflight stop {button.value} --reason "…"'
    return f'preflight decide {button.value} {button.action} --reason "…" --by NAME'


def to_text(message: Message, now: float | None = None) -> str:
    """Plain text, one block after another: logs, tests, `--plain` output."""
    out: list[str] = []
    for block in message.blocks:
        if isinstance(block, Heading):
            out.append(f"== {block.text} ==")
        elif isinstance(block, Text):
            out.append(block.text)
        elif isinstance(block, Fields):
            out.extend(f"{label}: {value}" for label, value in block.pairs)
        elif isinstance(block, StageLine):
            mark = STATE_MARK[block.state]
            elapsed = stage_elapsed(block, now)
            took = duration(elapsed) if elapsed is not None else ""
            out.append(f"{mark} {block.stage:<12} {block.state:<7} {took:>8} "
                       f"{block.detail}".rstrip())
        elif isinstance(block, Table):
            out.append(" | ".join(block.columns))
            out.extend(" | ".join(row) for row in block.rows)
            if block.total_rows and block.total_rows > len(block.rows):
                out.append(f"({len(block.rows)} of {block.total_rows} rows shown)")
        elif isinstance(block, Progress):
            out.append(progress_words(block))
        elif isinstance(block, Actions):
            out.extend(f"{b.label}: {button_command(b)}" for b in block.buttons)
        elif isinstance(block, Attachment):
            out.append(f"attached: {block.title} ({block.path})")
    return "\n".join(out)


def status_line(message: Message, now: float) -> str | None:
    """One plain line for the running stage of a status message (off a terminal):
    ``… pilot running 12 s: 5000/20000 (25%), 812 items/s, ETA 18 s``."""
    running = [b for b in message.blocks if isinstance(b, StageLine) and b.state == "running"]
    if not running:
        return None
    row = running[-1]
    elapsed = stage_elapsed(row, now)
    line = f"{STATE_MARK['running']} {row.stage} running"
    if elapsed is not None:
        line += f" {duration(elapsed)}"
    progress = [b for b in message.blocks if isinstance(b, Progress)]
    if progress and row.stage == "pilot":
        line += ": " + progress_words(progress[-1])
    return line


def stage_changes(before: Message | None, after: Message) -> list[str]:
    """Plain lines for the stages whose state changed between two status messages."""
    old = {b.stage: b.state for b in (before.blocks if before else ())
           if isinstance(b, StageLine)}
    out = []
    for block in after.blocks:
        if isinstance(block, StageLine) and block.state not in ("pending", "running") \
                and old.get(block.stage) != block.state:
            took = f" ({duration(block.elapsed_s)})" if block.elapsed_s is not None else ""
            detail = f": {block.detail}" if block.detail else ""
            out.append(f"{STATE_MARK[block.state]} {block.stage} {block.state}{took}{detail}")
    return out
