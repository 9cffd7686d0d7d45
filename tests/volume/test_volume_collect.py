"""The ``collect`` stage on a real two-node Ray cluster (issue 35 point 3).

A head and a second raylet on this machine (ray.cluster_utils.Cluster); the second has
its own copy of the run (``PREFLIGHT_NODE_RUN_DIR`` in its environment, as the
dispatcher sets it on a node), so its worker writes its shards there, not in the head's
run directory. The driver is the real runner (``python -m runner``) joining the cluster.
After the items, the ``collect`` stage brings the node's shards to the head; a resume
brings only the shard the head lost; a shard changed on its node fails the stage, named.
A third node whose disk is wiped after its items, before the collection, answers without
its shards: the collection forgets their inputs in the ledger and fails saying so, and a
resume runs them again, every input then counted once.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runner.balance import compute_balance
from runner.outputs import read_output
from runner.spec import NODE_RUN_DIR_ENV, NODE_WHERE_ENV
from tests.runner.test_stages_kit import runner_env
from tests.volume.kit import cluster_env, events, kill_group, make_volume, set_params, start_runner

COUNT = 200


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, dict[str, str],
                                                                          Path]]:
    env = cluster_env()
    saved = {k: os.environ.get(k) for k in (*env, NODE_RUN_DIR_ENV)}
    os.environ.update(env)
    from ray.cluster_utils import Cluster

    node_dir = tmp_path_factory.mktemp("node2") / "runs" / "r-vol"
    c = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "num_gpus": 0, "include_dashboard": False})
    try:
        os.environ[NODE_RUN_DIR_ENV] = str(node_dir)  # the second raylet's, and its workers'
        c.add_node(num_cpus=1, num_gpus=0)
        os.environ.pop(NODE_RUN_DIR_ENV)
        c.wait_for_nodes()
        yield c, env, node_dir
    finally:
        c.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _run(spec: Path, run_dir: Path, env: dict[str, str], *args: str) -> dict[str, Any]:
    proc = start_runner(spec, run_dir, *args, env=runner_env(**env))
    try:
        proc.wait(timeout=300)
    finally:
        kill_group(proc)
    finished = [e for e in events(run_dir) if e.type == "run.finished"]
    assert finished, (run_dir.parent / f"{run_dir.name}.log").read_text()[-3000:]
    return dict(finished[-1].data)


def _stage(run_dir: Path, name: str) -> dict[str, Any]:
    ends = [e for e in events(run_dir) if e.type in ("stage.passed", "stage.failed")
            and e.data["stage"] == name]
    return dict(ends[-1].data)


def test_collection_after_the_items_resumes_with_what_is_missing_and_names_a_tampered_shard(
        two_nodes: Any, tmp_path: Path) -> None:
    c, env, node_dir = two_nodes
    spec, ids = make_volume(tmp_path, COUNT, address=c.address)
    set_params(spec, outputs=True)
    node_dir.mkdir(parents=True, exist_ok=True)
    (node_dir / "spec.json").write_text(spec.read_text())  # the node's copy of the run
    run_dir = tmp_path / "run"

    finished = _run(spec, run_dir, env)
    assert finished["status"] == "passed", finished
    started = [e.data["stage"] for e in events(run_dir) if e.type == "stage.started"]
    assert started.index("pilot") < started.index("collect") < started.index("balance")
    node_shards = sorted(p.name for p in (node_dir / "outputs" / "shards").glob("*.jsonl"))
    assert node_shards, "the second node's worker wrote no shard"
    facts = _stage(run_dir, "collect")["facts"]
    assert facts["files"] == len(node_shards) and facts["problems"] == []
    assert facts["nodes"] == 1 and facts["bytes"] > 0 and facts["seconds"] >= 0
    for name in node_shards:
        assert (run_dir / "outputs" / "shards" / name).read_bytes() == \
            (node_dir / "outputs" / "shards" / name).read_bytes()
    with open(run_dir / "balance.csv", encoding="utf-8", newline="") as fh:
        refs = {row["id"]: row["output"] for row in csv.DictReader(fh) if row["output"]}
    assert len(refs) == COUNT - len([i for i in ids if int(i[5:]) % 97 == 0])
    for iid, ref in refs.items():  # every output found on the head by its id
        assert read_output(str(run_dir), ref, iid)["n"] == int(iid[5:])

    lost = run_dir / "outputs" / "shards" / node_shards[0]
    lost.unlink()  # the head lost one: a resume brings that one alone
    finished = _run(spec, run_dir, env, "--resume")
    assert finished["status"] == "passed", finished
    facts = _stage(run_dir, "collect")["facts"]
    assert facts["files"] == 1 and facts["present_files"] == len(node_shards) - 1
    assert lost.exists()

    with open(node_dir / "outputs" / "shards" / node_shards[0], "ab") as fh:
        fh.write(b'{"id": "planted", "output": {}}\n')  # changed on its node
    lost.unlink()
    finished = _run(spec, run_dir, env, "--resume")
    failed = _stage(run_dir, "collect")
    assert finished["status"] == "failed" and failed["error"]["type"] != "Timeout"
    message = failed["error"]["message"]
    assert f"outputs/shards/{node_shards[0]}" in message and str(node_dir) in message
    assert "refused, nothing replaced" in message and not lost.exists()
    assert json.loads((run_dir / "balance.json").read_text())["ok"]  # the balance still ran


def test_a_node_that_lost_its_shards_before_the_collection_has_its_inputs_run_again(
        two_nodes: Any, tmp_path: Path) -> None:
    c, env, node_dir = two_nodes
    shutil.rmtree(node_dir, ignore_errors=True)  # the first test's copy of its run
    spec, ids = make_volume(tmp_path, COUNT, address=c.address)
    set_params(spec, outputs=True)
    third_dir = tmp_path / "node3" / "runs" / "r-vol"
    for where in (node_dir, third_dir):
        where.mkdir(parents=True, exist_ok=True)
        (where / "spec.json").write_text(spec.read_text())
    def third_node() -> Any:  # named as the manifest would (its workers' place)
        os.environ.update({NODE_RUN_DIR_ENV: str(third_dir), NODE_WHERE_ENV: "node-3"})
        try:
            return c.add_node(num_cpus=1, num_gpus=0)
        finally:
            os.environ.pop(NODE_RUN_DIR_ENV)
            os.environ.pop(NODE_WHERE_ENV)

    third = third_node()
    c.wait_for_nodes()
    run_dir = tmp_path / "run"
    _run(spec, run_dir, env, "--stages", "pilot")  # the items only: nothing collected yet
    lost = sorted(p.name for p in (third_dir / "outputs" / "shards").glob("*.jsonl"))
    assert lost, "the third node's worker wrote no shard"
    c.remove_node(third)  # the node's machine replaced: its disk wiped, then it is back
    shutil.rmtree(third_dir / "outputs")
    third = third_node()
    c.wait_for_nodes()

    finished = _run(spec, run_dir, env, "--resume")
    failed = _stage(run_dir, "collect")
    assert finished["status"] == "failed", finished
    assert finished["first_error"]["stage"] == "collect", finished["first_error"]
    message = failed["error"]["message"]
    forgotten = failed["facts"]["forgotten_inputs"]
    assert forgotten > 0 and failed["facts"]["lost_files"] == len(lost)
    assert f"{forgotten:,} input(s) forgotten by the ledger" in message
    assert f"outputs/shards/{lost[0]}" in message and "runs them again" in message
    balance = json.loads((run_dir / "balance.json").read_text())
    assert not balance["ok"]
    assert balance["accepted"] + balance["refused"] == COUNT - forgotten
    missing = [p for p in balance["problems"] if p["kind"] == "missing"]
    assert len(missing) == forgotten and all("lost by the node" in p["detail"]
                                             for p in missing), missing[:3]

    finished = _run(spec, run_dir, env, "--resume")
    assert finished["status"] == "passed", finished
    balance = json.loads((run_dir / "balance.json").read_text())
    assert balance["ok"] and balance["total"] == COUNT
    assert balance["warnings"][0]["kind"] == "outputs_lost"
    assert f"{forgotten:,} ledger row(s) forgotten" in balance["warnings"][0]["detail"]
    done = [e.data for e in events(run_dir) if e.type == "item.done"]
    reruns = [d["id"] for d in done if d.get("rerun")]
    assert len(reruns) == len(set(reruns)) == forgotten  # each forgotten input's new event
    spec_doc = json.loads(spec.read_text())  # the bot's recheck over every item event
    recheck = compute_balance(ids, spec_doc["inputs"]["expected_refusals"], ["even", "odd"],
                              done)
    assert recheck.ok and (recheck.accepted, recheck.refused) == (
        balance["accepted"], balance["refused"]), recheck.problems[:3]
    with open(run_dir / "balance.csv", encoding="utf-8", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(row["id"] for row in rows) == sorted(ids)  # each input once
    for row in rows:  # every output read on the head by its id, none from the lost node
        if row["output"]:
            assert read_output(str(run_dir), row["output"], row["id"])["n"] == \
                int(row["id"][5:])
            assert row["output"].split("#")[0].rsplit("/", 1)[-1] not in lost
