"""The rules of the ``volume`` section: its nodes and how its workers share the cards.

Pure: every finding goes into the caller's ``Report`` with its field path, so the user
sees a node listed twice or a worker larger than a node as one located problem each.
Whether each SSH node's lease is known is the service's check at approval (it needs the
store); see ``bot.pilot.volume``.
"""

from __future__ import annotations

from typing import Any, Protocol

from bot.manifest.catalog import GpuModel
from bot.manifest.model import Hardware, Volume
from bot.manifest.nodes import NodeSpec
from runner.spec import node_share


class Report(Protocol):
    """The part of ``bot.manifest.rules.Report`` these rules use."""

    def problem(self, loc: tuple[Any, ...], message: str, *, severity: str = ...) -> None: ...

    def warn(self, loc: tuple[Any, ...], message: str) -> None: ...


def check_volume(volume: Volume, gpu: GpuModel | None, hardware: Hardware | None,
                 report: Report) -> None:
    _check_inputs(volume, report)
    if isinstance(volume.nodes, int):
        _check_count(volume.nodes, report)
        nodes: list[NodeSpec] = []
    else:
        nodes = list(volume.nodes or [])
        if volume.nodes is not None and not nodes:
            report.problem(("volume", "nodes"), "an empty list: list the nodes, or leave "
                           "volume.nodes out to run on the pilot's node")
        _check_nodes(nodes, report)
        if len(nodes) > 1:
            report.warn(("volume", "nodes"), f"{len(nodes)} nodes listed: Ray is started on "
                        "each (the driver on volume.nodes[0]) once the node has its own copy "
                        "of the run and has proven its cards (device, compute, interconnect): "
                        "it offers only its healthy cards, and a node whose proof fails "
                        "refuses the launch")
    if gpu is None or hardware is None:
        return
    if gpu.is_cpu:
        if volume.cards_per_worker > 1:
            report.warn(("volume", "cards_per_worker"), "hardware.gpu is cpu: the volume runs "
                        "on CPU workers and cards_per_worker is ignored")
        return
    cards = hardware.lots * gpu.cards_per_lot
    count = max(1, len(nodes))
    if count > cards:
        report.problem(("volume", "nodes"), f"{count} nodes but only {cards} {gpu.key} card(s) "
                       f"rented ({hardware.lots} lot(s) x {gpu.cards_per_lot}): every node "
                       "needs at least one card")
        return
    if not _lots_fit_nodes(gpu, hardware, count, report):
        return
    per_node = node_share(hardware.lots, gpu.cards_per_lot, count)  # the runner's rule
    if volume.cards_per_worker > per_node:
        report.problem(("volume", "cards_per_worker"),
                       f"{volume.cards_per_worker} cards per worker, but a node has "
                       f"{per_node} ({cards} rented card(s) over {count} node(s)): no worker "
                       "could start; a worker's cards are on one node")
    elif per_node % volume.cards_per_worker:
        report.warn(("volume", "cards_per_worker"),
                    f"{per_node} cards per node do not divide by {volume.cards_per_worker}: "
                    f"{per_node % volume.cards_per_worker} card(s) per node stay idle")


def check_node_lots(gpu: GpuModel | None, hardware: Hardware | None, volume: Volume | None,
                    report: Report) -> None:
    """A rent of several node-sized lots (``H100x8``) with no nodes listed: the pilot's
    node alone would be judged against every lot's cards (``runner.spec.node_share``)."""
    if gpu is None or hardware is None or not gpu.lot_is_node or hardware.lots == 1:
        return
    if volume is not None and isinstance(volume.nodes, list) and volume.nodes:
        return  # check_volume matches them with the lots
    report.problem(("hardware", "lots"), f"{hardware.lots} {gpu.key} lots are "
                   f"{hardware.lots} nodes of {gpu.cards_per_lot} {gpu.card} cards, but no "
                   "volume.nodes lists them: the pilot's node alone would be expected to "
                   f"show all {hardware.lots * gpu.cards_per_lot}; list every rented node in "
                   "volume.nodes (the pilot's node among them), or rent 1 lot for the pilot")


def _lots_fit_nodes(gpu: GpuModel, hardware: Hardware, count: int, report: Report) -> bool:
    """Every node holds the same whole lots: a lot is never split over machines (each
    node proves the same share), and a node-sized lot is one node."""
    lots = hardware.lots
    if lots % count:
        report.problem(("volume", "nodes"), f"{lots} lots over {count} nodes do not split "
                       f"evenly: every node must show the same share of the rent and a lot "
                       f"is never split over machines; list a number of nodes that divides "
                       f"hardware.lots ({lots})")
        return False
    if gpu.lot_is_node and count != lots:
        report.problem(("volume", "nodes"), f"one {gpu.key} lot is one node: {lots} lots are "
                       f"{lots} nodes, volume.nodes lists {count}; list each rented node once "
                       f"(each shows its {gpu.cards_per_lot} cards)")
        return False
    return True


def _check_inputs(volume: Volume, report: Report) -> None:
    """``volume.inputs.dir`` (the bot's copy) or ``on_nodes`` alone (a corpus only the
    nodes hold, listed on the head node at dispatch), never neither."""
    inputs = volume.inputs
    if inputs.dir is not None:
        return
    if not inputs.on_nodes:
        report.problem(("volume", "inputs", "dir"), "required: the corpus's folder under "
                       "project.dir; for a corpus only the ssh nodes hold, give its path on "
                       "the nodes as volume.inputs.on_nodes instead")
    elif inputs.frames is not None:
        report.problem(("volume", "inputs", "frames"), "frames of a corpus only the nodes "
                       "hold cannot be counted before dispatch: give volume.inputs.dir (the "
                       "bot's copy) too, or leave frames out")


def _check_count(count: int, report: Report) -> None:
    if count == 1:
        report.warn(("volume", "nodes"), "a count of nodes is the older form: 1 means the "
                    "pilot's node (leave volume.nodes out, or list the nodes, each like node)")
    else:
        report.problem(("volume", "nodes"), f"{count} nodes: list them, each like node "
                       "(kind: ssh, host, port, user, workdir); a count says nothing about "
                       "which machines")


def _check_nodes(nodes: list[NodeSpec], report: Report) -> None:
    first: dict[str, int] = {}
    kinds = {n.kind for n in nodes}
    for index, node in enumerate(nodes):
        loc = ("volume", "nodes", index)
        if node.is_remote and node.host is None:
            report.problem((*loc, "host"), f"an {node.kind} node needs a host (the machine's "
                           "address)")
            continue
        if not node.is_remote and len(kinds) > 1:
            report.problem((*loc, "kind"), "a volume runs on this machine alone (one local "
                           "node) or on SSH nodes, not both: the bot's host never joins "
                           "a rented cluster")
        key = node.identity
        if key in first:
            report.problem(loc, f"node {key} is listed twice (also volume.nodes[{first[key]}]); "
                           "each machine runs one Ray node: list it once")
        else:
            first[key] = index
