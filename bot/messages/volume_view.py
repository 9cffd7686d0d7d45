"""What the user sees of a volume on Ray: its pace and what happened to its workers.

Built from the runner's ``progress`` events (``done``, ``total`` and, from the volume's
driver, ``items_per_s``, ``eta_s``, ``per_card``) and its ``volume.*`` events (a worker or
node lost, a batch re-queued or split, an input refused alone, a card excluded, a worker
started in place of another, a late result counted once).
"""

from __future__ import annotations

from typing import Any

from bot.messages.model import Heading, Message, Progress, Text
from bot.pilot.record import Run
from runner.events import (
    VOLUME_CARD_EXCLUDED,
    VOLUME_LATE,
    VOLUME_LIMIT,
    VOLUME_NODE_LOST,
    VOLUME_REQUEUED,
    VOLUME_SPLIT,
    VOLUME_WORKER_LOST,
    VOLUME_WORKER_STARTED,
    VOLUME_WORKERS,
    Event,
    list_total,
)

NOTE_TYPES = (VOLUME_WORKERS, VOLUME_WORKER_LOST, VOLUME_NODE_LOST, VOLUME_REQUEUED,
              VOLUME_CARD_EXCLUDED, VOLUME_LATE, VOLUME_SPLIT, VOLUME_WORKER_STARTED,
              VOLUME_LIMIT)
NOTES_SHOWN = 12


def progress_of(data: dict[str, Any]) -> Progress:
    """A progress block from a ``progress`` event's fields (pace only when the runner
    measured it)."""
    return Progress(int(data.get("done", 0)), int(data.get("total", 0)), pace(data))


def pace(data: dict[str, Any]) -> str:
    rate = data.get("items_per_s")
    if not isinstance(rate, (int, float)):
        return ""
    parts = [f"{rate:.1f} items/s"]
    eta = data.get("eta_s")
    if isinstance(eta, (int, float)):
        parts.append(f"ETA {_duration(float(eta))}" + _held(data))
    cards = data.get("per_card")
    if isinstance(cards, dict) and cards:
        rates = ", ".join(f"{k} {v:.1f}" for k, v in sorted(cards.items())[:16])
        parts.append(f"{len(cards)} worker(s): {rates}")
    return " · ".join(parts)


def _held(data: dict[str, Any]) -> str:
    """The batches held far longer than a batch takes (a hung input): an ETA from the pace
    alone would say "1 s" for minutes."""
    held, since = data.get("held"), data.get("held_s")
    if not isinstance(held, int) or held < 1 or not isinstance(since, (int, float)):
        return ""
    limit = data.get("held_limit_s")
    until = (f", its worker stopped at {_duration(float(limit))}"
             if isinstance(limit, (int, float)) else "")
    return (f" ({held} batch{'es' if held > 1 else ''} held for {_duration(float(since))}"
            f"{until})")


def _duration(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def note(event: Event) -> Text | None:
    d = event.data
    if event.type == VOLUME_WORKERS:
        workers = d.get("workers") or []
        nodes = len({w.get("node") for w in workers if isinstance(w, dict)})
        more = "+" if list_total(d, "workers") > len(workers) else ""  # capped: LIST_CAP
        return Text(f"{list_total(d, 'workers')} worker(s) started on {nodes}{more} node(s)",
                    "muted")
    if event.type == VOLUME_WORKER_LOST:
        return Text(f"worker {d.get('worker')} lost ({d.get('reason')}); its batch is "
                    "handed to another worker", "warn")
    if event.type == VOLUME_NODE_LOST:
        host = f" ({d.get('host')})" if d.get("host") else ""
        why = f": {d.get('reason')}" if d.get("reason") else ""
        return Text(f"node {str(d.get('node'))[:12]}{host} lost with "
                    f"{list_total(d, 'workers')} worker(s) and card(s) "
                    f"{', '.join(d.get('cards') or []) or '-'}{why}; its batches go to the "
                    "other nodes", "error")
    if event.type == VOLUME_SPLIT:
        refused = d.get("refused") or []
        if refused:
            return Text("; ".join(f"input {r.get('id')} refused: {r.get('reason')}"
                                  for r in refused), "warn")
        return Text(f"batch {d.get('batch')} ({d.get('items')} items) split in "
                    f"{len(d.get('parts') or [])} ({d.get('cause')}: {d.get('reason')}) to "
                    "find the input that fails", "muted")
    if event.type == VOLUME_WORKER_STARTED:
        if not d.get("worker"):
            return Text(f"a worker could not be started {d.get('why') or ''}: "
                        f"{d.get('error')}", "warn")
        return Text(f"worker {d.get('worker')} started {d.get('why') or ''}", "muted")
    if event.type == VOLUME_REQUEUED:
        return Text(f"batch {d.get('batch')} ({d.get('items')} items) re-queued: "
                    f"{d.get('reason')}", "warn")
    if event.type == VOLUME_CARD_EXCLUDED and not d.get("worker"):  # by a node's card proof
        return Text(f"card {', '.join(d.get('cards') or []) or '?'} of node {d.get('node')} "
                    f"excluded by its {d.get('stage')} stage: {d.get('reason')}", "warn")
    if event.type == VOLUME_CARD_EXCLUDED:
        return Text(f"worker {d.get('worker')} excluded: {d.get('reason')}", "warn")
    if event.type == VOLUME_LIMIT:
        return Text(limit_line(d), "warn")
    if event.type == VOLUME_LATE:
        return Text(f"late result of batch {d.get('batch')}: {d.get('recorded')} recorded, "
                    f"{d.get('re_executed')} already recorded (counted as re-executed, "
                    "never twice)", "muted")
    return None


def limit_line(d: dict[str, Any]) -> str:
    """The thread's line when the driver widened the volume's time limit."""
    def dur(key: str) -> str:
        value = d.get(key)
        return _duration(float(value)) if isinstance(value, (int, float)) else "?"
    rate = d.get("items_per_s")
    pace_text = f"{rate:.3g} items/s" if isinstance(rate, (int, float)) else "a slower pace"
    cut = " (cut to the lease's end)" if d.get("lease_cut") else ""
    return (f"the items run slower than forecast ({pace_text}, about {dur('projected_s')} "
            f"for the work stage): its time limit widened from {dur('was_s')} to "
            f"{dur('limit_s')}{cut}, within the lease")


def volume_message(run: Run, events: list[Event]) -> Message | None:
    """The volume's engine notes, updated in place; None before any."""
    notes = [n for n in (note(e) for e in sorted(events, key=lambda e: e.seq)) if n]
    if not notes:
        return None
    shown = notes[-NOTES_SHOWN:]
    blocks: list[Any] = [Heading(f"Volume engine — {run.name}"), *shown]
    if len(notes) > len(shown):
        blocks.insert(1, Text(f"{len(notes) - len(shown)} earlier note(s) in events.jsonl",
                              "muted"))
    return Message(run.id, "volume", tuple(blocks), summary=shown[-1].text)
