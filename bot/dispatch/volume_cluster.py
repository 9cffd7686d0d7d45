"""A volume's Ray cluster around a dispatch: started before the driver, stopped after.

When a volume run's manifest lists more than one node in ``volume.nodes`` (all of the
head's kind), the dispatcher puts the run into every node's own workdir (``NodeCopy``);
this module, over each node's ``Node`` (``bot/nodes/base.py``: the kind's adapter, which
the dispatcher hands in as ``node_of``), proves each node's cards there
(``bot/dispatch/card_proof.py``), starts Ray on every one of them
(``bot/dispatch/ray_cluster.py``: the head on ``volume.nodes[0]``, where the driver runs;
each node offering the cards its proof left healthy), writes the head's address and the
proofs into the run's spec (``volume.address``, ``volume.nodes``) and hands the run's token
to the launcher on its standard input, which puts it in the driver's environment only.
Which nodes run Ray (never the token) is kept in the run directory's ``ray_cluster.json``,
one row per node of ``volume.nodes`` in order, so a stop, the end of the run, or a
restarted bot ends Ray on every node.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from bot.dispatch.base import Decision, RunHandle
from bot.dispatch.card_proof import NodeCopy, NodeProof, head_proof, prove_nodes
from bot.dispatch.plan import plan_of
from bot.dispatch.ray_cluster import RayCluster, RayNode, RayPorts, start_cluster, stop_cluster
from bot.dispatch.upload import require_address
from bot.errors import DispatchError
from bot.manifest.nodes import NodeSpec
from bot.nodes.base import Node
from runner.files import write_text_atomic
from runner.spec import node_share

CLUSTER_FILE = "ray_cluster.json"
RayNodeOf = Callable[[int, Node, str, bool], RayNode]
NodeOf = Callable[[NodeSpec], Node]  # the kind's adapter: a node section -> its Node


def default_ray_node(index: int, node: Node, run_id: str, gpus: bool) -> RayNode:
    """Node ``index`` of the cluster: the pinned ports (moved to ``ray_port`` when the
    manifest sets it), a temp dir of the run's own (short: Ray's sockets live there); its
    cards (None here) are those its card proof left."""
    tag = hashlib.sha256(run_id.encode()).hexdigest()[:8]
    ports = RayPorts()
    if node.ray_port:
        ports = ports.shifted(node.ray_port - ports.gcs)
    return RayNode(node.where, node.host, node.python, None, ports,
                   f"/tmp/pf-ray-{tag}-{index}")


PORTS_APART = 100  # how far a node's layout moves from another's on the same host


def apart(pairs: list[tuple[Node, RayNode]]) -> list[tuple[Node, RayNode]]:
    """Two volume nodes on one host (the same address) cannot share Ray's ports: a node
    whose ports the manifest left unset is moved ``PORTS_APART`` at a time until it shares
    none with an earlier node there (recorded in ``ray_cluster.json`` with the rest); two
    set by the manifest that overlap are refused, naming both."""
    out: list[tuple[Node, RayNode]] = []
    for node, ray in pairs:
        same = [(s, r) for s, r in out if r.address == ray.address]
        clash = next((s for s, r in same if r.ports.overlaps(ray.ports)), None)
        if clash is not None and node.ray_port:
            raise DispatchError(
                f"{node.where}: volume.nodes ray_port {node.ray_port} overlaps the Ray ports "
                f"of {clash.where} on the same host {ray.address}: set ray_port "
                f"{PORTS_APART} or more apart")
        while any(r.ports.overlaps(ray.ports) for _, r in same):
            ray = replace(ray, ports=ray.ports.shifted(PORTS_APART))
        out.append((node, ray))
    return out


def volume_nodes(handle: RunHandle, kind: str | None = None) -> list[NodeSpec]:
    """The nodes of a volume run that lists several in ``volume.nodes`` ([] for any other
    run: one node's volume starts a local Ray on that node), each with its ``host`` and
    ``workdir`` (a DispatchError naming the field); with ``kind`` (the calling adapter's
    own: this module names none), a DispatchError unless all are of it."""
    plan = plan_of(handle)
    if not plan.spec().get("volume"):
        return []
    nodes = plan.volume_nodes
    if len(nodes) < 2:
        return []
    other = next((n for n in nodes if kind is not None and n.kind != kind), None)
    if other is not None:
        raise DispatchError(f"run {handle.run_id}: volume.nodes: several nodes must all be "
                            f"kind {kind} (one is kind {other.kind})")
    for node in nodes:
        require_address(node.model_dump())
    return list(nodes)


def end_earlier_cluster(node_of: NodeOf, handle: RunHandle) -> None:
    """Stop the Ray an earlier attempt of this run left (a resume), or refuse naming why."""
    left = stop_volume_cluster(node_of, handle)
    if left:
        raise DispatchError(f"run {handle.run_id}: the Ray of its earlier attempt could not "
                            "be stopped: " + "; ".join(left))


@dataclass(frozen=True)
class VolumeStart:
    """A several-node volume's Ray, up, and the spec its head's driver is to be sent: the
    run's spec (the launch plan's) with the cluster's address, the nodes' proofs and the
    time limit the service decided, a new value."""

    cluster: RayCluster
    spec: dict[str, Any]


def start_volume_cluster(node_of: NodeOf, handle: RunHandle, copies: Sequence[NodeCopy],
                         ray_node: RayNodeOf = default_ray_node) -> VolumeStart | None:
    """Prove every node's cards from its own copy of the run (``copies``, one per node of
    ``volume.nodes``, already uploaded), then start Ray on every node, each reached through
    ``node_of`` (its kind's adapter); the head's spec points at it. None for any other run.
    A failed proof refuses before any Ray starts; the nodes are recorded before the first
    ``ray start``. The head's spec is also kept in the run directory (``spec.json``: what
    the head was sent, read by no dispatch)."""
    nodes = [node_of(spec) for spec in volume_nodes(handle)]
    if not nodes:
        return None
    if len(copies) != len(nodes):
        raise DispatchError(f"run {handle.run_id}: {len(nodes)} volume node(s) but "
                            f"{len(copies)} copies of the run")
    end_earlier_cluster(node_of, handle)
    spec = plan_of(handle).spec()
    gpus = bool(spec["volume"].get("gpus"))
    decisions: list[Decision] = []

    def hear(step: dict[str, Any]) -> None:
        answer = handle.progress(step)
        if answer is not None:
            decisions.append(answer)

    proofs = prove_nodes(nodes, copies, gpus, hear, share=node_cards(spec, len(nodes)))
    # hearing the proofs, the service may have widened the driver's time limit to the
    # forecast on the proven nodes (bot/service/proven.py): its answer, not a file edit
    limits = [d.time_limit_s for d in decisions if d.time_limit_s is not None]
    if limits:
        spec["volume"] = {**spec["volume"], "time_limit_s": limits[-1]}
    pairs = apart([(n, _placed(ray_node(i, n, handle.run_id, gpus), proof, copy))
                   for i, (n, proof, copy) in enumerate(zip(nodes, proofs, copies))])
    _write(handle.run_dir / CLUSTER_FILE,
           {"nodes": [{"node": n.where, "ray": asdict(r)} for n, r in pairs]})
    cluster = start_cluster(_shell(pairs), [r for _, r in pairs],
                            lambda i, ray: hear({"node": ray.where, "index": i,
                                                 "phase": "ray_up"}))
    spec["volume"] = {**spec["volume"], "address": cluster.address,
                      "nodes": [p.to_dict() for p in proofs],
                      "head_proof": head_proof(copies[0], handle.run_id, proofs[0])}
    _write(handle.spec_path, spec)
    return VolumeStart(cluster, spec)


def node_cards(spec: dict[str, Any], nodes: int) -> int | None:
    """The cards each node of the volume is rented for (its spec's ``hardware``: the one
    rule, ``runner.spec.node_share``), the most its card proof may offer; None for a spec
    that names no hardware."""
    hardware = spec.get("hardware")
    if not isinstance(hardware, dict):
        return None
    share = hardware.get("node_cards")
    if isinstance(share, int) and not isinstance(share, bool) and share > 0:
        return share
    return node_share(int(hardware.get("lots") or 1), int(hardware.get("cards_per_lot") or 1),
                      nodes)


def _placed(node: RayNode, proof: NodeProof, copy: NodeCopy) -> RayNode:
    """The node offering its proven cards, its Ray pointed at its own copy of the run. A
    layout that fixes the cards itself keeps them (the tests' fake GPU resources)."""
    cards = node.cards if node.cards is not None else proof.cards
    return replace(node, cards=cards, package_root=copy.package_root, run_dir=copy.run_dir)


def stop_volume_cluster(node_of: NodeOf, handle: RunHandle) -> list[str]:
    """End this run's Ray on every node it was started on (nothing when there is none),
    each reached through ``node_of``; returns the problems met. The record is removed once
    every node is stopped."""
    path = handle.run_dir / CLUSTER_FILE
    try:
        rays = _read(path)
    except FileNotFoundError:  # none, or another bot process stopped it and removed it
        return []
    specs = volume_nodes(handle)
    if len(specs) != len(rays):
        raise DispatchError(f"{path}: {len(rays)} node(s) run this volume's Ray, but the run "
                            f"lists {len(specs)} in volume.nodes")
    pairs = [(node_of(spec), ray) for spec, ray in zip(specs, rays)]
    other = next((n for n, r in pairs if n.where != r.where), None)
    if other is not None:
        raise DispatchError(f"{path}: {other.where} of volume.nodes is not the node its row "
                            "names")
    problems = stop_cluster(_shell(pairs), rays)
    if not problems:
        path.unlink(missing_ok=True)
    return problems


def _shell(pairs: list[tuple[Node, RayNode]]) -> Any:
    # by where and temp dir, not identity: start_cluster sizes each node's ports anew
    by_key = {(r.where, r.temp_dir): n for n, r in pairs}

    def shell(node: RayNode, command: str, stdin: str = "") -> tuple[int, str, str]:
        return by_key[(node.where, node.temp_dir)].run(command, stdin.encode(), timeout=180)

    return shell


def _read(path: Path) -> list[RayNode]:
    """The record's Ray nodes, in ``volume.nodes`` order; FileNotFoundError when there is
    none."""
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))["nodes"]
        return [RayNode(**{**row["ray"], "ports": RayPorts(**row["ray"]["ports"]),
                           "cards": None if row["ray"]["cards"] is None
                           else tuple(row["ray"]["cards"])}) for row in rows]
    except FileNotFoundError:
        raise
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DispatchError(f"{path}: cannot read which nodes run this volume's Ray: "
                            f"{exc}") from exc


def _write(path: Path, data: dict[str, Any]) -> None:
    write_text_atomic(path, json.dumps(data, indent=2))  # temp file + rename, no link followed
