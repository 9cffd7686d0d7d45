"""A several-node volume's outputs, brought to the head once the items are done.

The files themselves are listed and copied by ``runner/volume_outputs.py``; this module
asks the nodes' workers for them over Ray.
"""

from __future__ import annotations

from typing import Any, Dict, List, Tuple

from runner.stage import StageContext
from runner.volume_workers import Worker


def collect_node_outputs(ctx: StageContext, ray: Any, workers: List[Worker], *,
                         keep_on_nodes: bool = False) -> Dict[str, Any]:
    """One live worker of each node lists its node's ``outputs/``; the files of every
    node but the head are copied to the head's, checked (runner/volume_outputs.py), before
    the evidence stage checksums them; with ``keep_on_nodes`` (``volume.outputs_on_nodes``)
    they stay there and only each node's listing (paths, sizes, SHA-256) is written on the
    head. A failure here leaves the files on their nodes and is told in the facts; it never
    fails the volume."""
    from runner.volume_outputs import collect_outputs, record_outputs

    live = [w for w in workers if w.usable]
    try:
        listings = ray.get([w.actor.outputs_listing.remote() for w in live], timeout=600)
        chosen: Dict[str, Tuple[Worker, Dict[str, Any]]] = {}
        for worker, listing in zip(live, listings):
            run_dir = listing.get("run_dir")
            if run_dir and run_dir not in chosen:
                chosen[str(run_dir)] = (worker, listing)
        pairs = list(chosen.values())
        if keep_on_nodes:
            return record_outputs(ctx.run_dir, [listing for _w, listing in pairs])
        facts = collect_outputs(ctx.run_dir, [listing for _w, listing in pairs],
                                lambda i, rel, off, n: ray.get(
                                    pairs[i][0].actor.outputs_chunk.remote(rel, off, n),
                                    timeout=600))
    except Exception as exc:  # a worker lost meanwhile, Ray gone: the files stay there
        facts = {"files": 0, "bytes": 0, "refused": [
            f"the nodes' outputs were not collected: {type(exc).__name__}: {exc}"]}
    return dict(facts)
