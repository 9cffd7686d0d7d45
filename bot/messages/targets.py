"""What an approval will spend on: the volume's nodes, the cards rented and the hosts.

Built from the run's recorded manifest and plan, so the approver sees exactly the machines
the volume would use (the pilot's node when the manifest lists no ``volume.nodes``), before
anything is launched. Neutral: transports render the pairs (views' Fields, a Slack modal).
"""

from __future__ import annotations

from bot.manifest.nodes import NodeSpec
from bot.pilot.plan import format_usd
from bot.pilot.record import Run


def volume_nodes(run: Run) -> list[tuple[str, NodeSpec]]:
    """The nodes the volume of this pilot would run on, each with its field path (none:
    no volume section; no ``volume.nodes``: the pilot's ``node``)."""
    manifest = run.manifest
    if manifest is None or manifest.volume is None:
        return []
    nodes = manifest.volume.nodes
    if isinstance(nodes, list) and nodes:
        return [(f"volume.nodes[{i}]", n) for i, n in enumerate(nodes)]
    return [("node", manifest.node)]


def spend_pairs(run: Run) -> list[tuple[str, str]]:
    """(label, value) lines of what approving this pilot launches; empty without a volume."""
    placed = volume_nodes(run)
    nodes = [n for _, n in placed]
    if not nodes:
        return []
    plan = run.plan
    hosts = sorted({n.host_label for n in nodes})
    cards = (f"{plan.total_cards} card(s) "
             f"({plan.lots} {plan.gpu} lot(s) x {plan.cards_per_lot}) for "
             f"{plan.days} day(s), {format_usd(plan.total_usd)} USD") if plan is not None \
        else "no plan recorded"
    return [("Volume nodes", "; ".join(f"{where}: {n.label}" for where, n in placed)),
            ("Cards", cards), ("Hosts", ", ".join(hosts))]


def spend_lines(run: Run) -> list[str]:
    """The same as plain lines (a confirmation dialog)."""
    return [f"{label}: {value}" for label, value in spend_pairs(run)]
