"""What the user sees while a several-node volume is being started, node by node.

Built from the dispatch's own ``dispatch.node`` events (``runner.events.DISPATCH_NODE``:
``node``, ``index``, ``phase``), which the bot records as each node's copy is sent, its
cards are proven and its Ray is up: ten nodes take minutes before the driver's first line,
and the thread says where the start is instead of nothing.
"""

from __future__ import annotations

from typing import Any

from bot.messages.model import Heading, Message, Text
from bot.pilot.record import Run
from runner.events import DISPATCH_NODE, Event

PHASES = ("uploaded", "proved", "ray_up", "launching")
LABELS = {"listed": "corpus listed", "uploading": "sending its copy", "uploaded": "copy sent",
          "proved": "cards proven", "ray_up": "Ray up", "launching": "driver launching"}
NODES_SHOWN = 12


def node_count(run: Run) -> int:
    """The nodes ``volume.nodes`` lists (0 when the manifest lists none)."""
    nodes = run.volume_nodes
    return len(nodes) if isinstance(nodes, list) else 0


def node_line(data: dict[str, Any]) -> str:
    """One node's latest step: "volume.nodes[3] gpu-3:22: cards proven (8 card(s))"."""
    phase = str(data.get("phase"))
    text = f"volume.nodes[{data.get('index')}] {data.get('node')}: {LABELS.get(phase, phase)}"
    if phase == "uploading" and isinstance(data.get("bytes_total"), int):
        text += (f" ({int(data.get('bytes_done') or 0) / 1e6:.1f} of "
                 f"{data['bytes_total'] / 1e6:.1f} MB)")
    if phase == "listed" and isinstance(data.get("count"), int):  # a corpus only on the nodes
        text += f" ({data['count']:,} inputs, {int(data.get('bytes') or 0) / 1e6:.1f} MB)"
    if phase == "uploaded" and isinstance(data.get("bytes"), int):
        text += f" ({data['bytes'] / 1e6:.1f} MB sent)"
    if phase == "proved":
        cards = data.get("cards")
        text += " (CPUs only)" if cards == [] else f" ({len(cards)} card(s))" \
            if isinstance(cards, list) else " (every card it sees)"
        if data.get("excluded"):
            text += f", {data['excluded']} excluded"
    return text


def dispatch_message(run: Run, events: list[Event]) -> Message | None:
    """Where the start of each node stands (updated in place); None before any step."""
    steps = [e for e in sorted(events, key=lambda e: e.seq) if e.type == DISPATCH_NODE]
    if not steps:
        return None
    latest: dict[int, dict[str, Any]] = {}
    reached: dict[str, int] = {p: 0 for p in PHASES}
    for event in steps:
        index = int(event.data.get("index") or 0)
        latest[index] = event.data
        if event.data.get("phase") in reached:
            reached[str(event.data["phase"])] += 1
    total = node_count(run) or len(latest)
    summary = (f"starting on {total} node(s): {reached['uploaded']}/{total} copied, "
               f"{reached['proved']}/{total} proven, {reached['ray_up']}/{total} Ray up")
    if reached["launching"]:
        summary += "; launching the driver"
    lines = [Text(node_line(latest[i]), "muted") for i in sorted(latest)[:NODES_SHOWN]]
    if len(latest) > NODES_SHOWN:
        lines.append(Text(f"and {len(latest) - NODES_SHOWN} more node(s)", "muted"))
    blocks: list[Any] = [Heading(f"Starting the volume — {run.name}"), Text(summary),
                         *lines]
    return Message(run.id, "dispatch", tuple(blocks), summary=summary)
