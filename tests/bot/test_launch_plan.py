"""The launch plan (bot/dispatch/plan.py): what a start needs of its run's manifest, taken
once by the service and handed to the dispatch, which then reads no manifest.yaml back;
a handle built without one reads the run directory's, with the same answers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from bot.dispatch.base import RunHandle
from bot.dispatch.corpus import corpus_node_only, corpus_on_nodes
from bot.dispatch.plan import LaunchPlan
from bot.dispatch.upload import node_section
from bot.dispatch.volume_cluster import volume_nodes
from bot.errors import DispatchError

NODES = [{"kind": "ssh", "host": f"gpu-{i}", "workdir": "/w", "port": 22} for i in range(2)]
SPEC = {"volume": {"gpus": False}}
VOLUME: dict[str, Any] = {"nodes": NODES, "inputs": {"on_nodes": "/data/corpus",
                                                      "pattern": "*.txt", "expected_count": 3}}


def _run_dir(tmp_path: Path, volume: bool = True) -> Path:
    (tmp_path / "spec.json").write_text(json.dumps({"volume": {"gpus": False}} if volume
                                                   else {}), encoding="utf-8")
    return tmp_path


def _answers(handle: RunHandle, spec: dict[str, Any]) -> tuple[Any, ...]:
    return ([n.host for n in volume_nodes(handle)], corpus_on_nodes(handle, spec),
            corpus_node_only(handle, spec), node_section(handle)["host"])


def test_the_dispatch_reads_its_plan_and_no_manifest(tmp_path: Path) -> None:
    run_dir = tmp_path  # no spec.json, no manifest.yaml: the plan holds both
    plan = LaunchPlan.of(NODES[0], VOLUME, spec_text=json.dumps(SPEC))
    handle = RunHandle("r", run_dir, run_dir / "spec.json", run_dir, plan=plan)
    assert not (run_dir / "manifest.yaml").exists() and not (run_dir / "spec.json").exists()
    spec = {"volume": {"gpus": False}}
    assert _answers(handle, spec) == (["gpu-0", "gpu-1"], "/data/corpus", True, "gpu-0")
    # a pilot's spec has no volume: the plan's volume part does not apply
    assert corpus_on_nodes(handle, {}) is None and not corpus_node_only(handle, {})


def test_a_handle_without_a_plan_reads_the_same_from_the_run_directory(
        tmp_path: Path) -> None:
    run_dir = _run_dir(tmp_path)
    (run_dir / "manifest.yaml").write_text(yaml.safe_dump({"node": NODES[0],
                                                            "volume": VOLUME}))
    handle = RunHandle("r", run_dir, run_dir / "spec.json", run_dir)
    planned = RunHandle("r", run_dir, run_dir / "spec.json", run_dir,
                        plan=LaunchPlan.of(NODES[0], VOLUME,
                                           spec_text=(run_dir / "spec.json").read_text()))
    assert _answers(handle, SPEC) == _answers(planned, SPEC) == (
        ["gpu-0", "gpu-1"], "/data/corpus", True, "gpu-0")


def test_a_plan_is_a_frozen_value(tmp_path: Path) -> None:
    plan = LaunchPlan.of(NODES[0], VOLUME)
    assert [n.model_dump(mode="json", exclude_defaults=True) for n in plan.volume_nodes] == \
        [{k: v for k, v in n.items() if k != "port"} for n in NODES]
    assert all(n.is_remote for n in plan.volume_nodes) and plan.inputs_dir is None
    try:
        plan.on_nodes = "/elsewhere"  # type: ignore[misc]
    except AttributeError:
        pass
    else:
        raise AssertionError("a LaunchPlan can be edited")
    assert LaunchPlan.of(None, None) == LaunchPlan(node=None)


def test_a_plan_of_a_node_that_is_not_one_is_refused_naming_it() -> None:
    try:
        LaunchPlan.of(NODES[0], {"nodes": [NODES[0], {"kind": "vm"}]})
    except DispatchError as exc:
        assert str(exc).startswith("volume.nodes[1]: ")
    else:
        raise AssertionError("a node of no kind was planned")
