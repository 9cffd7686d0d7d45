"""What an approval will spend on: the volume's nodes, the cards rented and the hosts.

Built from the run's recorded manifest and plan, so the approver sees exactly the machines
the volume would use (the pilot's node when the manifest lists no ``volume.nodes``), before
anything is launched. Neutral: transports render the pairs (views' Fields, a Slack modal).
"""

from __future__ import annotations

from typing import Any


def node_label(node: dict[str, Any]) -> str:
    """``local (the bot host itself)`` or ``ssh user@host:port``."""
    if node.get("kind", "local") == "local":
        return "local (the bot host itself)"
    user = f"{node['user']}@" if node.get("user") else ""
    return f"ssh {user}{node.get('host')}:{node.get('port', 22)}"


def volume_nodes(run: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The nodes the volume of this pilot would run on, each with its field path (none:
    no volume section; no ``volume.nodes``: the pilot's ``node``)."""
    manifest = run.get("manifest_json") or {}
    volume = manifest.get("volume")
    if not isinstance(volume, dict):
        return []
    nodes = volume.get("nodes")
    if isinstance(nodes, list) and nodes:
        return [(f"volume.nodes[{i}]", n) for i, n in enumerate(nodes) if isinstance(n, dict)]
    node = manifest.get("node")
    return [("node", node if isinstance(node, dict) else {"kind": "local"})]


def spend_pairs(run: dict[str, Any]) -> list[tuple[str, str]]:
    """(label, value) lines of what approving this pilot launches; empty without a volume."""
    placed = volume_nodes(run)
    nodes = [n for _, n in placed]
    if not nodes:
        return []
    plan = run.get("plan") or {}
    hosts = sorted({"the bot host" if n.get("kind", "local") == "local"
                    else str(n.get("host")) for n in nodes})
    cards = (f"{plan.get('total_cards')} {plan.get('gpu')} card(s) "
             f"({plan.get('lots')} lot(s) x {plan.get('cards_per_lot')}) for "
             f"{plan.get('days')} day(s), {plan.get('total_usd')} USD")
    return [("Volume nodes", "; ".join(f"{where}: {node_label(n)}" for where, n in placed)),
            ("Cards", cards), ("Hosts", ", ".join(hosts))]


def spend_lines(run: dict[str, Any]) -> list[str]:
    """The same as plain lines (a confirmation dialog)."""
    return [f"{label}: {value}" for label, value in spend_pairs(run)]
