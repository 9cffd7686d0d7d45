"""Which node a volume's driver runs on: ``volume.nodes[0]``, else the pilot's node.

Its lease is checked by the dispatch guard like a pilot's; the other nodes' leases by
``bot.pilot.leases.check_volume_leases``.
"""

from __future__ import annotations

from bot.manifest.model import Manifest, Node


def volume_node(manifest: Manifest) -> Node:
    """The node the volume run (its driver, the Ray head) is dispatched to."""
    volume = manifest.volume
    if volume is not None and isinstance(volume.nodes, list) and volume.nodes:
        return volume.nodes[0]
    return manifest.node
