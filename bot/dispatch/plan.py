"""The launch plan: what a start needs of its run, taken once.

The service builds it when it starts the run (``bot/service/handles.py``) and hands it to
the dispatcher on the ``RunHandle``: the run's spec as the service wrote it at submission
(``spec.json``'s one writer), the manifest's text, the run's node section, a several-node
volume's nodes, and a volume's corpus on the nodes. The dispatch reads no ``spec.json`` or
``manifest.yaml`` back: what a node is sent is a new value built from the plan
(``UploadPlan.rewrite_spec``, a volume head's ``VolumeStart.spec``), never an edited file. A
handle built without a plan (a test, a tool acting on a run directory) gets one read from
its run directory here (``plan_of``), the one reader of those files on the dispatch side.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import yaml

from bot.errors import DispatchError
from bot.manifest.nodes import NodeSpec, node_spec


@dataclass(frozen=True)
class LaunchPlan:
    node: NodeSpec | None  # the manifest's node (a volume's: its head), typed by its kind
    volume_nodes: tuple[NodeSpec, ...] = ()  # volume.nodes as listed (a volume run)
    on_nodes: str | None = None  # volume.inputs.on_nodes: the corpus already on the nodes
    inputs_dir: str | None = None  # volume.inputs.dir (none with on_nodes: nodes only)
    # the run's spec as JSON text (its bytes, so the plan stays a value: ``spec()`` gives
    # each caller its own dict), and why there is none when it could not be had
    spec_text: str | None = None
    spec_problem: str = "the run has no spec"
    manifest_text: str = ""  # manifest.yaml as submitted (copied to a node as it is)

    @property
    def node_only(self) -> bool:
        """The corpus is only on the nodes: ``on_nodes`` without ``volume.inputs.dir``."""
        return bool(self.on_nodes) and not self.inputs_dir

    def spec(self) -> dict[str, Any]:
        """A fresh copy of the run's spec (a caller's edits reach no one else); a
        DispatchError naming the spec when the plan has none."""
        if self.spec_text is None:
            raise DispatchError(self.spec_problem)
        try:
            data = json.loads(self.spec_text)
        except ValueError as exc:
            raise DispatchError(f"{self.spec_problem}: {exc}") from exc
        if not isinstance(data, dict):
            raise DispatchError(f"{self.spec_problem}: not a JSON object")
        return data

    @classmethod
    def of(cls, node: Any, volume: Any, *, spec_text: str | None = None,
           spec_problem: str = "the run has no spec", manifest_text: str = "") -> LaunchPlan:
        """The plan of a run's node section and its manifest's ``volume`` section (as
        JSON: the checked manifest's, or a run directory's), each node typed by its kind
        (a DispatchError names one that is not a node), with the run's spec and manifest
        as written. What of the volume applies is the dispatch's to say, by the run's spec
        (a pilot's has no ``volume``)."""
        volume = volume if isinstance(volume, dict) else {}
        nodes = volume.get("nodes")
        inputs = volume.get("inputs") if isinstance(volume.get("inputs"), dict) else {}
        on_nodes, directory = inputs.get("on_nodes"), inputs.get("dir")
        listed = nodes if isinstance(nodes, list) else []
        return cls(node=_typed(node, "node") if isinstance(node, dict) else None,
                   volume_nodes=tuple(_typed(n, f"volume.nodes[{i}]")
                                      for i, n in enumerate(listed)),
                   on_nodes=str(on_nodes) if on_nodes else None,
                   inputs_dir=str(directory) if directory else None,
                   spec_text=spec_text, spec_problem=spec_problem,
                   manifest_text=manifest_text)


def _typed(node: Any, where: str) -> NodeSpec:
    typed = node_spec(node)
    if typed is None:
        raise DispatchError(f"{where}: {str(node)[:200]} is not a node the manifest takes; "
                            "nothing was started")
    return typed


def spec_text_of(path: Path) -> tuple[str | None, str]:
    """The run's ``spec.json`` as text, or None and the problem that names it (raised by
    ``LaunchPlan.spec`` only where a spec is needed)."""
    try:
        return path.read_text(encoding="utf-8"), f"the spec {path}"
    except OSError as exc:
        return None, f"cannot read the spec {path}: {exc}"


def read_plan(run_dir: Path, spec_path: Path) -> LaunchPlan:
    """The plan of a run directory (a handle built without one): its ``manifest.yaml``
    (a missing one: no node, no volume; one that cannot be read a DispatchError) and the
    spec at ``spec_path``."""
    path = run_dir / "manifest.yaml"
    try:
        text = path.read_text(encoding="utf-8")
        data = yaml.safe_load(text) or {}
    except FileNotFoundError:
        text, data = "", {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise DispatchError(f"{path}: cannot read the run's manifest: {exc}") from exc
    data = data if isinstance(data, dict) else {}
    spec_text, problem = spec_text_of(spec_path)
    return LaunchPlan.of(data.get("node"), data.get("volume"), spec_text=spec_text,
                         spec_problem=problem, manifest_text=text)


class Planned(Protocol):
    """What ``plan_of`` needs of a ``RunHandle``."""

    @property
    def plan(self) -> LaunchPlan | None: ...

    @property
    def run_dir(self) -> Path: ...

    @property
    def spec_path(self) -> Path: ...


def plan_of(handle: Planned) -> LaunchPlan:
    """The handle's launch plan, else the one its run directory gives (``read_plan``)."""
    return handle.plan if handle.plan is not None else read_plan(handle.run_dir,
                                                                 handle.spec_path)
