"""The volume's engine on a real Ray cluster of three simulated nodes with fake cards.

One cluster (ray.cluster_utils.Cluster: a head and two more raylets on this machine, one
fake GPU each) serves every test of the module (the one that removes a node runs last);
the driver is the real runner (``python -m runner`` with a volume spec joining the
cluster). Each id must end up exactly once in the ledger and the balance whatever is lost,
killed or late.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.threads import owned_cores
from tests.processes import wait_until
from tests.runner.test_stages_kit import runner_env
from tests.volume.kit import (
    cluster_env,
    events,
    executed,
    kill_group,
    ledger_ids,
    make_volume,
    our_actor_pids,
    progress_done,
    set_params,
    start_runner,
)

COUNT = 3000


@pytest.fixture(scope="module")
def cluster() -> Iterator[tuple[Any, dict[str, str]]]:
    env = cluster_env()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 1, "include_dashboard": False})
    for _ in range(2):
        c.add_node(num_cpus=1, num_gpus=1)
    c.wait_for_nodes()
    try:
        yield c, env
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _token(env: dict[str, str]) -> str:
    """The cluster's actors inherit its raylets' environment: its token marks them."""
    return f"RAY_AUTH_TOKEN={env['RAY_AUTH_TOKEN']}"


def _three_nodes(c: Any) -> None:
    """Top the module's cluster up to three nodes (a test that removed one runs last, so
    this adds nothing when the module runs in order)."""
    if len(c.worker_nodes) < 2:
        c.add_node(num_cpus=1, num_gpus=1)
        c.wait_for_nodes()


def _balance(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "balance.json").read_text())


def _exactly_once(run_dir: Path, ids: list[str]) -> dict[str, Any]:
    in_ledger = ledger_ids(run_dir)
    assert sorted(in_ledger) == ids  # every id, none twice (the ledger's key), none invented
    balance = _balance(run_dir)
    assert balance["ok"], balance["problems"][:5]
    assert balance["total"] == len(ids) and balance["accepted"] + balance["refused"] == len(ids)
    rows = (run_dir / "balance.csv").read_text().splitlines()[1:]
    assert Counter(r.split(",")[0] for r in rows) == Counter(ids)
    return balance


def _pilot_facts(run_dir: Path) -> dict[str, Any]:
    passed = [e for e in events(run_dir) if e.type == "stage.passed"
              and e.data["stage"] == "pilot"]
    assert passed, [e.data for e in events(run_dir) if e.type == "stage.failed"]
    return dict(passed[-1].data["facts"])


def test_killed_driver_resumes_exactly_the_missing_ids_and_a_late_worker_is_replaced(
        cluster: Any, tmp_path: Path) -> None:
    c, env = cluster
    _three_nodes(c)
    spec, ids = make_volume(tmp_path, COUNT, address=c.address, gpus=True,
                            batch_timeout_s=1.5)
    set_params(spec, delay_s=0.01, slow_id="item-00030",
               slow_marker=str(tmp_path / "slow.marker"), slow_s=5)
    run_dir = tmp_path / "run"
    proc = start_runner(spec, run_dir, env=runner_env(**env))
    try:
        wait_until(lambda: any(e.type == "volume.worker_started" for e in events(run_dir)),
                   "a worker started in place of the late one", 240)
        wait_until(lambda: progress_done(run_dir) >= 900, "more progress", 240)
    finally:
        kill_group(proc)  # SIGKILL: the driver (and its worker process) die at once
    at_kill = set(ledger_ids(run_dir))
    assert 0 < len(at_kill) < COUNT
    excluded = [e.data for e in events(run_dir) if e.type == "volume.card_excluded"]
    assert len(excluded) == 1 and "cards freed" in excluded[0]["reason"]
    split = [e.data for e in events(run_dir) if e.type == "volume.split"][0]
    # a batch held past its timeout is run again one input a batch (issue 37)
    assert split["cause"] == "late" and split["items"] == 25 and len(split["parts"]) == 25
    started = [e.data for e in events(run_dir) if e.type == "volume.worker_started"][0]
    late_worker = excluded[0]["worker"]
    assert started["worker"] and late_worker in started["why"]
    # the late worker was stopped: its card went to the worker started in its place
    assert started["cards"] == excluded[0]["cards"]
    assert not [e for e in events(run_dir) if e.type == "volume.late_result"]
    wait_until(lambda: not our_actor_pids(_token(env)), "the dead driver's actors to end", 60)

    set_params(spec, tag="resume", delay_s=0)  # what ran, not how fast, is checked now
    resumed = start_runner(spec, run_dir, "--resume", env=runner_env(**env))
    try:
        assert resumed.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_group(resumed)
    # Exactly the missing ids, once each (the memory stage's trial batch aside: it runs
    # the handler in the runner's own worker, outside the volume, and records nothing).
    trial = [e for e in events(run_dir) if e.type == "stage.passed"
             and e.data["stage"] == "memory"][-1].data["facts"]["batch_ids"]
    assert Counter(executed(tmp_path, "resume")) == Counter(set(ids) - at_kill) + Counter(trial)
    balance = _exactly_once(run_dir, ids)
    assert balance["accepted"] == COUNT - len([i for i in ids if int(i[5:]) % 97 == 0])
    facts = _pilot_facts(run_dir)
    assert facts["remaining"] == COUNT - len(at_kill) and facts["re_executed_total"] == 0
    wait_until(lambda: not our_actor_pids(_token(env)), "the run's actors to end", 60)


def test_a_node_lost_mid_run_has_its_batches_requeued(cluster: Any, tmp_path: Path) -> None:
    c, env = cluster
    spec, ids = make_volume(tmp_path, COUNT, address=c.address, gpus=True,
                            batch_timeout_s=120)
    # slow enough that the GCS marks the node dead (its missed health checks) before the end
    set_params(spec, delay_s=0.03, fast_marker=str(tmp_path / "fast.marker"))
    run_dir = tmp_path / "run"
    _three_nodes(c)
    proc = start_runner(spec, run_dir, env=runner_env(**env))
    try:
        wait_until(lambda: progress_done(run_dir) >= 400, "the volume to get going", 240)
        victim = list(c.worker_nodes)[-1]
        c.remove_node(victim, allow_graceful=False)  # its raylet SIGKILLed, not drained
        wait_until(lambda: any(e.type == "volume.node_lost" for e in events(run_dir)),
                   "the driver to see the node lost", 240)
        (tmp_path / "fast.marker").touch()  # the loss is handled: the rest may run fast
        assert proc.wait(timeout=240) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_group(proc)
    _exactly_once(run_dir, ids)
    types = Counter(e.type for e in events(run_dir))
    assert types["volume.node_lost"] == 1 and types["volume.worker_lost"] == 1
    assert types["volume.requeued"] >= 1
    # its batches went back whole: a lost node is not a batch that failed (issue 23)
    assert types["volume.split"] == 0, [e.data for e in events(run_dir)
                                        if e.type == "volume.split"]
    assert {e.data["items"] for e in events(run_dir) if e.type == "volume.requeued"} == {25}
    facts = _pilot_facts(run_dir)
    assert facts["workers"] == 3 and facts["nodes_lost"] == 1
    assert facts["engine"] == "ray" and facts["ray_version"] == facts["ray_pinned"]
    workers = [e for e in events(run_dir) if e.type == "volume.workers"][0].data["workers"]
    assert len({w["node"] for w in workers}) == 3  # one worker per node, its one card each
    assert all(len(w["cards"]) == 1 for w in workers)
    # a GPU worker reserves no CPU: torch gets its node's cores shared by the node's workers
    assert {(w["torch_threads"], w["torch_threads_why"]) for w in workers} == {
        (owned_cores(1)[0], f"the cores the worker owns: {owned_cores(1)[1]}")}
    wait_until(lambda: not our_actor_pids(_token(env)), "the run's actors to end", 60)
