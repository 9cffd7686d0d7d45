"""The launch plan: what a start needs of its run beyond the spec, taken once.

The service builds it from the run's checked manifest when it starts the run
(``bot/service/handles.py``) and hands it to the dispatcher on the ``RunHandle``: the run's
node section, a several-node volume's nodes, and a volume's corpus on the nodes. The
dispatch reads no ``manifest.yaml`` back for them. A handle built without a plan (a test,
a tool acting on a run directory) gets one read from the run directory's ``manifest.yaml``
here, the one reader of it on the dispatch side.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bot.errors import DispatchError
from bot.manifest.nodes import NodeSpec, node_spec


@dataclass(frozen=True)
class LaunchPlan:
    node: NodeSpec | None  # the manifest's node (a volume's: its head), typed by its kind
    volume_nodes: tuple[NodeSpec, ...] = ()  # volume.nodes as listed (a volume run)
    on_nodes: str | None = None  # volume.inputs.on_nodes: the corpus already on the nodes
    inputs_dir: str | None = None  # volume.inputs.dir (none with on_nodes: nodes only)

    @property
    def node_only(self) -> bool:
        """The corpus is only on the nodes: ``on_nodes`` without ``volume.inputs.dir``."""
        return bool(self.on_nodes) and not self.inputs_dir

    @classmethod
    def of(cls, node: Any, volume: Any) -> LaunchPlan:
        """The plan of a run's node section and its manifest's ``volume`` section (as
        JSON: the checked manifest's, or a run directory's), each node typed by its kind
        (a DispatchError names one that is not a node). What of the volume applies is the
        dispatch's to say, by the run's spec (a pilot's has no ``volume``)."""
        volume = volume if isinstance(volume, dict) else {}
        nodes = volume.get("nodes")
        inputs = volume.get("inputs") if isinstance(volume.get("inputs"), dict) else {}
        on_nodes, directory = inputs.get("on_nodes"), inputs.get("dir")
        listed = nodes if isinstance(nodes, list) else []
        return cls(node=_typed(node, "node") if isinstance(node, dict) else None,
                   volume_nodes=tuple(_typed(n, f"volume.nodes[{i}]")
                                      for i, n in enumerate(listed)),
                   on_nodes=str(on_nodes) if on_nodes else None,
                   inputs_dir=str(directory) if directory else None)


def _typed(node: Any, where: str) -> NodeSpec:
    typed = node_spec(node)
    if typed is None:
        raise DispatchError(f"{where}: {str(node)[:200]} is not a node the manifest takes; "
                            "nothing was started")
    return typed


def read_plan(run_dir: Path) -> LaunchPlan:
    """The plan of a run directory's ``manifest.yaml`` (a handle built without one); a
    missing file is a plan with nothing in it, one that cannot be read a DispatchError."""
    path = run_dir / "manifest.yaml"
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except FileNotFoundError:
        return LaunchPlan(node=None)
    except (OSError, yaml.YAMLError) as exc:
        raise DispatchError(f"{path}: cannot read the run's manifest: {exc}") from exc
    data = data if isinstance(data, dict) else {}
    return LaunchPlan.of(data.get("node"), data.get("volume"))
