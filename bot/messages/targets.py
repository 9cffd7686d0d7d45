"""What an approval will spend on: the volume's nodes, the cards rented and the hosts.

Built from the run's recorded manifest and plan, so the approver sees exactly the machines
the volume would use (the pilot's node when the manifest lists no ``volume.nodes``), before
anything is launched. Neutral: transports render the pairs (views' Fields, a Slack modal).
"""

from __future__ import annotations

from typing import Any

from bot.pilot.plan import format_usd
from bot.pilot.record import Run


def node_label(node: dict[str, Any]) -> str:
    """``local (the bot host itself)`` or ``ssh user@host:port``."""
    if node.get("kind", "local") == "local":
        return "local (the bot host itself)"
    user = f"{node['user']}@" if node.get("user") else ""
    return f"ssh {user}{node.get('host')}:{node.get('port', 22)}"


def volume_nodes(run: Run) -> list[tuple[str, dict[str, Any]]]:
    """The nodes the volume of this pilot would run on, each with its field path (none:
    no volume section; no ``volume.nodes``: the pilot's ``node``)."""
    manifest = run.manifest
    if manifest is None or manifest.volume is None:
        return []
    nodes = manifest.volume.nodes
    if isinstance(nodes, list) and nodes:
        return [(f"volume.nodes[{i}]", n.model_dump(mode="json")) for i, n in enumerate(nodes)]
    return [("node", manifest.node.model_dump(mode="json"))]


def spend_pairs(run: Run) -> list[tuple[str, str]]:
    """(label, value) lines of what approving this pilot launches; empty without a volume."""
    placed = volume_nodes(run)
    nodes = [n for _, n in placed]
    if not nodes:
        return []
    plan = run.plan
    hosts = sorted({"the bot host" if n.get("kind", "local") == "local"
                    else str(n.get("host")) for n in nodes})
    cards = (f"{plan.total_cards} card(s) "
             f"({plan.lots} {plan.gpu} lot(s) x {plan.cards_per_lot}) for "
             f"{plan.days} day(s), {format_usd(plan.total_usd)} USD") if plan is not None \
        else "no plan recorded"
    return [("Volume nodes", "; ".join(f"{where}: {node_label(n)}" for where, n in placed)),
            ("Cards", cards), ("Hosts", ", ".join(hosts))]


def spend_lines(run: Run) -> list[str]:
    """The same as plain lines (a confirmation dialog)."""
    return [f"{label}: {value}" for label, value in spend_pairs(run)]
