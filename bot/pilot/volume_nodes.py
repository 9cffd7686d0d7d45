"""Which node a volume's driver runs on: ``volume.nodes[0]``, else the pilot's node.

Its lease is checked by the dispatch guard like a pilot's; the other nodes' leases by
``bot.service.leases.check_volume_leases``.
"""

from __future__ import annotations

from bot.manifest.model import Manifest
from bot.manifest.nodes import NodeSpec


def volume_node(manifest: Manifest) -> NodeSpec:
    """The node the volume run (its driver, the Ray head) is dispatched to."""
    volume = manifest.volume
    if volume is not None and isinstance(volume.nodes, list) and volume.nodes:
        return volume.nodes[0]
    return manifest.node


def node_count(manifest: Manifest) -> int:
    """The nodes the rent is spread on: the nodes ``volume.nodes`` lists, else 1 (the
    pilot's node holds the whole rent). Each node must show its share of the cards
    (``runner.spec.node_share``), the pilot's node included."""
    volume = manifest.volume
    if volume is not None and isinstance(volume.nodes, list) and volume.nodes:
        return len(volume.nodes)
    return 1
