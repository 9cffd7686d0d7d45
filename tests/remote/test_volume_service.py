"""A several-node volume through the service, end to end, over two loopback sshd nodes.

The manifest's ``volume.nodes`` lists two SSH nodes (two sshd's, two leases provisioned).
Submitted and started through the service (real SQLite store, real SSH dispatcher, the
real runner), the pilot is followed to its verdict and approved through the service's
decision path (``PilotService.decide``: what `preflight decide … approve` and Slack's
Approve call). The volume then runs on a Ray cluster the dispatcher starts on both nodes:

1. its driver is SIGKILLed mid-run on the head: the service sees the run end, failed,
   and Ray is stopped on every node;
2. `preflight resume`'s path (``PilotService.resume``) starts a fresh cluster with a
   fresh token, which runs only ids missing from the ledger, and is stopped mid-run by
   `preflight stop`'s path (``PilotService.stop``): driver, actors and Ray on every node;
3. resumed again, it runs exactly the ids missing from the ledger and passes: every id
   once in the ledger, the balance and the store's items.

Each time the process table is read: nothing of an ended attempt is left running.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import sqlite3
import sys
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.volume_cluster import CLUSTER_FILE
from bot.manifest.load import load_manifest_file
from bot.service import PilotService
from runner.events import read_events
from runner.outputs import read_output
from tests.events_check import assert_recorded_whole
from tests.processes import alive, family, live_processes, still_running, wait_until
from tests.remote.remote_kit import provision
from tests.remote.sshd_server import Sshd
from tests.remote.volume_service_kit import (
    TwoNodesOneHost,
    attempts,
    compose,
    dispatcher_for,
    executed,
    stage_facts,
    stop_everything,
    write_project,
)

COUNT = 600


def _remote_dir(service: PilotService, run_id: str) -> Path:
    run_dir = Path(service.store.get_run(run_id)["run_dir"])
    return Path(json.loads((run_dir / "remote.json").read_text())["run_dir"])


def _ledger(service: PilotService, run_id: str) -> set[str]:
    path = _remote_dir(service, run_id) / "ledger.sqlite"
    if not path.exists():
        return set()
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return {r[0] for r in con.execute("SELECT id FROM items")}
    except sqlite3.OperationalError:  # the driver has not created its table yet
        return set()
    finally:
        con.close()


def _mid_run(service: PilotService, run_id: str, layout: TwoNodesOneHost,
             before: int) -> dict[int, str]:
    """Wait until this attempt has recorded a few batches, then take its processes: the
    runner (its supervisor's session), Ray on both nodes and the actors under them."""
    wait_until(lambda: len(_ledger(service, run_id)) >= before + 16,
               "the attempt to record a few batches", 240)
    run = service.store.get_run(run_id)
    assert (Path(run["run_dir"]) / CLUSTER_FILE).exists()  # which nodes run Ray, recorded
    spec = json.loads(Path(run["spec_path"]).read_text())
    assert spec["volume"]["address"] == f"127.0.0.1:{layout.ports.gcs}"  # this start's head
    proofs = [(p["index"], p["device"], p["excluded"]) for p in spec["volume"]["nodes"]]
    assert proofs == [(0, "cpu", []), (1, "cpu", [])]  # each node's card proof, this start's
    lock = json.loads((layout.workdirs[1] / "dispatch.lock").read_text())
    assert lock["run"] == run_id and alive(lock["pid"])  # node 2's workdir held while Ray is
    procs = family({int(run["pid"])}, layout.groups())
    actors = [p for p in procs if _cmdline(p).startswith(b"ray::_Worker")]
    assert len(actors) >= 2, procs  # the snapshot holds the actors too
    return procs


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def _gone(procs: dict[int, str], run_dir: Path, layout: TwoNodesOneHost) -> None:
    wait_until(lambda: not still_running(procs), "no process of the attempt left", 60)
    assert not (run_dir / CLUSTER_FILE).exists()  # Ray stopped on every node, recorded
    wait_until(lambda: not (layout.workdirs[1] / "dispatch.lock").exists(), "node 2 let go", 30)


def _pilot(service: PilotService, manifest: Path) -> str:
    pilot = service.submit(load_manifest_file(manifest), submitter="bob").run_id
    service.starter.start(pilot)
    run = service.follower.follow(pilot, timeout=180)
    assert (run["status"], run["outcome"]) == ("awaiting_decision", "passed"), (
        run["first_error"], run["verdict"])
    return pilot


def _killed(service: PilotService, volume: str, layout: TwoNodesOneHost) -> set[str]:
    """Attempt 1: the driver SIGKILLed on the head; the service sees it end, failed."""
    procs = _mid_run(service, volume, layout, 0)
    os.killpg(int(service.store.get_run(volume)["pid"]), signal.SIGKILL)
    run = service.follower.follow(volume, timeout=120)
    assert (run["status"], run["outcome"]) == ("finished", "failed"), run["first_error"]
    assert (run["first_error"]["stage"], run["first_error"]["type"]) == ("pilot",
                                                                          "RunnerExited")
    _gone(procs, Path(run["run_dir"]), layout)
    return _ledger(service, volume)


def _stopped(service: PilotService, volume: str, layout: TwoNodesOneHost,
             at_kill: set[str]) -> set[str]:
    """Attempt 2, resumed: stopped mid-run as `preflight stop` stops it."""
    service.resume(volume)
    procs = _mid_run(service, volume, layout, len(at_kill))
    run = service.stop(volume, by="alice", reason="stop the volume mid-run", timeout=120)
    assert (run["status"], run["stop"]["by"]) == ("stopped", "alice")
    _gone(procs, Path(run["run_dir"]), layout)
    return _ledger(service, volume)


def _finished(service: PilotService, volume: str, layout: TwoNodesOneHost,
              project: Path) -> dict[str, Any]:
    """Attempt 3, resumed again: slow until its processes are taken, then to the end."""
    service.resume(volume)
    procs = _mid_run(service, volume, layout, len(_ledger(service, volume)))
    (project / "slow").unlink()
    run = service.follower.follow(volume, timeout=240)
    _gone(procs, Path(run["run_dir"]), layout)
    return run


@pytest.fixture
def layout(tmp_path: Path) -> Iterator[TwoNodesOneHost]:
    """The two nodes' layout; every Ray temp dir it handed out is removed afterwards."""
    nodes = TwoNodesOneHost([tmp_path / "node0", tmp_path / "other" / "node1"])
    yield nodes
    for temp in nodes.temps:
        shutil.rmtree(temp, ignore_errors=True)


def test_a_two_node_volume_approved_killed_stopped_and_resumed_through_the_service(
        sshd: Sshd, sshd2: Sshd, tmp_path: Path, layout: TwoNodesOneHost) -> None:
    project = tmp_path / "project"
    nodes = [s.node(w, python=sys.executable) for s, w in zip((sshd, sshd2), layout.workdirs)]
    manifest, ids = write_project(project, nodes, COUNT)
    dispatcher = dispatcher_for([sshd, sshd2], layout, tmp_path / "known_hosts")
    service = compose(tmp_path / "home", dispatcher)
    try:
        for s in (sshd, sshd2):
            provision(service.store, s.lease_key)
        pilot = _pilot(service, manifest)
        # the pilot sent its 6 inputs and the code, not the volume's corpus (sent with it)
        (copy,) = (layout.workdirs[0] / "projects").iterdir()
        assert len(list((copy / "pilot").iterdir())) == 6 and not (copy / "corpus").exists()
        (project / "slow").touch()
        seen = [executed(project)]
        volume = service.decider.decide(pilot, "approve", "pilot clean", "alice")["volume_run"]
        at_kill = _killed(service, volume, layout)
        seen.append(executed(project))
        at_stop = _stopped(service, volume, layout, at_kill)
        seen.append(executed(project))
        run = _finished(service, volume, layout, project)
        seen.append(executed(project))
        remote = str(_remote_dir(service, volume))
        assert len(list((copy / "corpus").glob("item-*.txt"))) == COUNT
    finally:
        stop_everything(service, layout.groups)
    _nothing_of_the_run(layout, remote)
    assert 0 < len(at_kill) < len(at_stop) < COUNT
    _check_outcome(service, pilot, volume, run, ids)
    _check_attempts(service.store.events(volume), ids, seen, at_kill, at_stop, layout)
    _check_nodes(Path(remote), layout, ids)
    _check_token(dispatcher.sent, service, [tmp_path, *map(Path, layout.temps)])


def _nothing_of_the_run(layout: TwoNodesOneHost, remote: str) -> None:
    """The process table holds no Ray process of any attempt (by process group, or naming
    one of its temp dirs: Ray's agents rename themselves ray::...) and no runner of it."""
    groups, names = layout.groups(), [t.encode() for t in layout.temps] + [remote.encode()]
    assert len(groups) == 6  # two nodes, three attempts
    wait_until(lambda: not [p for p in live_processes() if p.pgid in groups
                            or any(n in p.cmdline for n in names)],
               "no Ray or runner process of the run", 60)


def _check_outcome(service: PilotService, pilot: str, volume: str, run: dict[str, Any],
                   ids: list[str]) -> None:
    """The pilot decided (approved by alice) and its one volume finished and passed, every
    id exactly once in the node's ledger, the balance and the store's items."""
    assert (run["kind"], run["parent_run"], run["status"], run["outcome"]) == (
        "volume", pilot, "finished", "passed"), (run["first_error"], run["verdict"])
    assert run["balance"]["ok"] and run["balance"]["total"] == len(ids), run["balance"]
    assert run["balance"]["recheck"]["ok"] and run["balance"]["accepted"] == len(ids)
    assert Counter(i["id"] for i in service.store.items(volume)) == Counter(ids)
    assert sorted(_ledger(service, volume)) == ids
    rows = (Path(run["run_dir"]) / "balance.csv").read_text().splitlines()[1:]
    assert Counter(r.split(",")[0] for r in rows) == Counter(ids)
    parent = service.store.get_run(pilot)
    assert (parent["status"], service.store.volume_of(pilot)) == ("decided", volume)
    assert [(d["decision"], d["by"], d["accepted"]) for d in
            service.store.decisions(pilot)] == [("approve", "alice", 1)]
    # recorded once each, in order, none lost (progress: each attempt's latest, the others
    # counted; tests/events_check.py)
    assert_recorded_whole(service.store, volume,
                          read_events(str(Path(run["run_dir"]) / "events.jsonl"))[0])


def _check_attempts(events: list[Any], ids: list[str], seen: list[Counter[str]],
                    at_kill: set[str], at_stop: set[str], layout: TwoNodesOneHost) -> None:
    """Three attempts, each on a cluster with workers on both nodes; each resume ran only
    ids missing from the ledger, the last exactly those (plus the memory stage's trial
    batch, which runs outside the volume and records nothing)."""
    runs = attempts(events)
    assert len(runs) == 3
    for attempt in runs:
        workers = [e for e in attempt if e.type == "volume.workers"][-1].data["workers"]
        assert len({w["node"] for w in workers}) == 2, workers  # a worker on each node
        run_dirs = {w["run_dir"] for w in workers}  # each node's workers in its own copy
        assert run_dirs == {f"{w}/runs/{attempt[0].run}" for w in layout.workdirs}
    trial = [Counter((stage_facts(a, "memory") or {}).get("batch_ids", [])) for a in runs]
    second = seen[2] - seen[1] - trial[1]
    assert second and set(second) <= set(ids) - at_kill and max(second.values()) == 1
    assert seen[3] - seen[2] == Counter(set(ids) - at_stop) + trial[2]
    facts = stage_facts(runs[2], "pilot")
    assert facts is not None and facts["remaining"] == len(ids) - len(at_stop)
    collected = stage_facts(runs[2], "collect")  # the other node's shards, to the head
    assert collected is not None and collected["nodes"] == 1 and collected["files"] > 0
    assert collected["problems"] == []
    assert facts["engine"] == "ray" and facts["re_executed_total"] == 0  # none came back twice


def _check_nodes(remote: Path, layout: TwoNodesOneHost, ids: list[str]) -> None:
    """Every item was read, and its handler and runner package loaded, from the copy of the
    run on the node whose raylet started its worker (read from the raylet's command line,
    not from our records); both nodes ran items; each node proved its cards from its copy."""
    # each output written on its worker's node, one shard per batch (collected to the
    # head's outputs/shards/ with the rest), found by its id from balance.csv's reference
    with open(remote / "balance.csv", encoding="utf-8", newline="") as fh:
        refs = {row["id"]: row["output"] for row in csv.DictReader(fh)}
    outputs = {i: read_output(str(remote), ref, i) for i, ref in refs.items()}
    assert sorted(outputs) == ids
    assert {ref.split("#")[0].split("/")[1] for ref in refs.values()} == {"shards"}
    used = set()
    for item, out in outputs.items():
        node = layout.node_of(out["raylet"])
        mine = str(layout.workdirs[node]) + "/"
        assert all(out[k].startswith(mine) for k in ("path", "module", "runner")), (item, out)
        assert out["path"].endswith(f"/{item}.txt") and out["text"] == item
        used.add(node)
    assert used == {0, 1}
    # The files the handler wrote itself on the second node were collected to the head
    # (runner/volume_outputs.py): every item's file is in the head's outputs/.
    other = layout.workdirs[1] / "runs" / remote.name / "outputs" / "files"
    assert list(other.glob("*.bin"))  # written there by node 1's workers
    collected = {p.stem: p.read_text() for p in (remote / "outputs" / "files").glob("*.bin")}
    assert sorted(collected) == ids and all(collected[i] == i for i in ids)
    for w in layout.workdirs:
        proof = (w / "runs" / remote.name / "card-proof" / "events.jsonl").read_text()
        assert '"stage": "compute"' in proof and '"stage.passed"' in proof


def _check_token(sent: list[tuple[str, str]], service: PilotService, roots: list[Path]) -> None:
    """A fresh token for each cluster, given on standard input only: on no command line,
    in no file of the run (the state database included), no Ray temp dir, no message."""
    tokens = {stdin.strip() for _, stdin in sent if stdin}
    assert len(tokens) == 3 and all(len(t) == 64 for t in tokens), len(tokens)
    published = repr(service.publisher.notifier.history)  # type: ignore[attr-defined]
    for token in tokens:
        assert not [c for c, _ in sent if token in c] and token not in published
        for root in roots:
            for path in root.rglob("*") if root.exists() else ():
                assert not path.is_file() or token.encode() not in path.read_bytes(), path
