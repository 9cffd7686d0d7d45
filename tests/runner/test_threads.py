"""Torch's intra-op threads in the pilot: the cores the worker owns, or task.torch_threads."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.manifest.load import load_manifest
from runner.stages import pilot as pilot_stage
from runner.threads import owned_cores, set_torch_threads
from tests.bot.manifest_helpers import dump, locs, make_project, merged
from tests.runner.test_workload_pilot import Harness

torch = pytest.importorskip("torch")


@pytest.fixture(autouse=True)
def _keep_torch_threads() -> Iterator[None]:
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_owned_cores_follow_the_affinity_mask_the_quota_and_the_workers(tmp_path: Path) -> None:
    import os

    mask = len(os.sched_getaffinity(0))
    unlimited = tmp_path / "unlimited"
    unlimited.write_text("max 100000\n")
    assert owned_cores(cpu_max=str(unlimited))[0] == mask
    one = tmp_path / "one"
    one.write_text("100000 100000\n")  # a container allowed one CPU
    cores, how = owned_cores(cpu_max=str(one))
    assert cores == 1 and ("quota" in how or mask == 1)
    assert owned_cores(cpu_max=str(tmp_path / "absent"))[0] == mask
    garbage = tmp_path / "garbage"
    garbage.write_text("lots\n")
    assert owned_cores(cpu_max=str(garbage))[0] == mask
    assert owned_cores(workers=mask * 2, cpu_max=str(unlimited))[0] == 1  # never zero


def test_torch_threads_set_to_the_owned_cores_unless_the_manifest_says(tmp_path: Path) -> None:
    facts = set_torch_threads(None)
    assert facts["torch_threads"] == owned_cores()[0] == torch.get_num_threads()
    assert "cores the worker owns" in facts["torch_threads_why"]
    facts = set_torch_threads(3)
    assert (facts["torch_threads"], facts["torch_threads_why"]) == (3, "task.torch_threads")
    assert torch.get_num_threads() == 3


def test_the_pilot_records_the_threads_it_chose_in_its_facts(tmp_path: Path) -> None:
    h = Harness(tmp_path, "ok")
    h.spec = dataclasses.replace(h.spec, task=dataclasses.replace(h.spec.task, torch_threads=1))
    facts, = h.run(pilot_stage.pilot)
    assert (facts["torch_threads"], facts["torch_threads_why"]) == (1, "task.torch_threads")
    assert facts["recorded"] == 5


def test_manifest_torch_threads_must_be_a_positive_integer(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(task={"torch_threads": 0}))
    problem = locs(tmp_path, text)["task.torch_threads"]
    assert problem.line is not None and "1" in problem.message
    loaded = load_manifest(dump(merged(task={"torch_threads": 2})), source="t.yaml",
                           base_dir=tmp_path)
    assert loaded.manifest.task.torch_threads == 2


def test_a_pilot_with_a_volume_measures_with_a_volume_workers_threads(tmp_path: Path) -> None:
    """A CPU volume worker gets the 1 CPU Ray gives it: the pilot whose volume follows runs
    its handler with 1 torch thread too, whatever the node's cores (issue 37)."""
    h = Harness(tmp_path, "ok")
    h.spec = dataclasses.replace(h.spec, task=dataclasses.replace(h.spec.task, worker_cards=0))
    facts, = h.run(pilot_stage.pilot)
    assert facts["torch_threads"] == 1 == torch.get_num_threads()
    assert "as Ray gives each CPU worker of the volume" in facts["torch_threads_why"]
    assert facts["threads_as"] == "volume worker"


def test_a_gpu_volume_worker_share_is_its_nodes_cores_over_its_workers() -> None:
    from runner.threads import worker_share

    assert worker_share(None) is None  # no volume: the pilot's own cores
    assert worker_share(0) == (1, "1 CPU, as Ray gives each CPU worker of the volume")
    facts = {"device": {"count": 8}, "compute": {"healthy_cards": [0, 1, 2, 3]}}
    threads, why = worker_share(2, facts)  # 4 healthy cards, 2 per worker: 2 workers
    assert threads == owned_cores(2)[0]
    assert "as each of the volume's 2 worker(s) of 2 card(s) on a node of 4 card(s)" in why
