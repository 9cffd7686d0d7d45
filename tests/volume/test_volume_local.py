"""The embedded default: the volume on a local Ray with CPU workers, the same engine.

The driver starts Ray itself (token authentication with a token of its own, no
dashboard); killed with SIGKILL, it leaves Ray's agents behind, which the resumed driver
ends before it starts a fresh Ray. Afterwards no process of either Ray session is left.
"""

from __future__ import annotations

import collections
import json
import os
import signal
from pathlib import Path

from runner.outputs import read_output
from runner.volume_ray import session_pids
from tests.processes import wait_until
from tests.runner.test_stages_kit import runner_env
from tests.volume.kit import (
    VOLWORK,
    events,
    kill_group,
    ledger_ids,
    make_volume,
    our_actor_pids,
    progress_done,
    run_marker,
    set_params,
    start_runner,
)


def _sessions(run_dir: Path) -> list[str]:
    return [e.data["facts"]["session"] for e in events(run_dir)
            if e.type == "stage.passed" and e.data["stage"] == "pilot"]


def test_local_volume_survives_a_killed_driver_and_leaves_nothing_running(
        tmp_path: Path) -> None:
    spec, ids = make_volume(tmp_path, 600, workers=2)
    set_params(spec, delay_s=0.02, outputs=True)
    run_dir = tmp_path / "run"
    # The run has a home of its own: another test's `ray start` beside it (the SSH
    # clusters) may write ~/.ray/auth_token; this run must write none.
    home = tmp_path / "home"
    home.mkdir()
    token = home / ".ray" / "auth_token"
    proc = start_runner(spec, run_dir, env=runner_env(HOME=str(home)))
    try:
        wait_until(lambda: progress_done(run_dir) >= 100, "the local volume to get going", 240)
    finally:
        kill_group(proc)
    record = json.loads((run_dir / "ray_session.json").read_text())
    first, pgid = record["session_dir"], record["pgid"]
    wait_until(lambda: session_pids(first, pgid) and not session_pids(first),
               "Ray's agents, renamed ray::..., to outlive the killed driver", 60)
    assert not token.exists()  # the token stays in memory
    set_params(spec, delay_s=0)
    resumed = start_runner(spec, run_dir, "--resume")
    try:
        assert resumed.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_group(resumed)
    assert sorted(ledger_ids(run_dir)) == ids
    balance = json.loads((run_dir / "balance.json").read_text())
    assert balance["ok"] and balance["total"] == 600
    # each accepted input's output written by its worker, one shard per batch, found by id
    outputs = {r["id"]: r["output"] for r in balance["rows"] if r["status"] == "accepted"}
    assert len(outputs) == 600 - 7 and all(
        read_output(str(run_dir), ref, iid)["n"] == int(iid.split("-")[1])
        for iid, ref in outputs.items())
    shards = {ref.split("#")[0] for ref in outputs.values()}
    assert len(shards) >= 600 // 25 and all(s.startswith("outputs/shards/a") for s in shards)
    assert not [p for p in (run_dir / "outputs").iterdir() if p.name != "shards"]
    worker = [e.data["workers"] for e in events(run_dir) if e.type == "volume.workers"][-1][0]
    assert worker["cards"] == [] and worker["torch_threads"] == 1  # a CPU worker: its one CPU
    assert worker["torch_threads_why"] == "the cores the worker owns: 1 CPU(s) Ray gave this worker"
    assert not session_pids(first, pgid)  # ... and the resumed driver ended them
    second = _sessions(run_dir)[-1]
    assert second and second not in first
    wait_until(lambda: not session_pids(f"/tmp/ray/{second}"), "the local Ray to stop", 60)
    assert not (run_dir / "ray_session.json").exists()


def test_stopping_a_volume_ends_the_driver_its_actors_and_its_ray(tmp_path: Path) -> None:
    """What `preflight stop RUN` does to a local runner: SIGTERM to its process group."""
    spec, ids = make_volume(tmp_path, 400, workers=2)
    set_params(spec, delay_s=0.05)
    run_dir = tmp_path / "run"
    proc = start_runner(spec, run_dir)
    try:
        wait_until(lambda: progress_done(run_dir) >= 50, "the local volume to get going", 240)
        record = json.loads((run_dir / "ray_session.json").read_text())
        assert our_actor_pids(run_marker(run_dir))
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(timeout=120) == 1
    finally:
        kill_group(proc)
    failed = [e for e in events(run_dir) if e.type == "stage.failed"]
    assert failed and failed[0].data["stage"] == "pilot"
    assert failed[0].data["error"]["type"] == "Interrupted"
    assert events(run_dir)[-1].type == "run.finished"
    assert 0 < len(ledger_ids(run_dir)) < len(ids)  # what finished is kept for resume
    wait_until(lambda: not session_pids(record["session_dir"], record["pgid"]),
               "every process of the run's Ray to end", 60)
    wait_until(lambda: not our_actor_pids(run_marker(run_dir)), "the run's actors to end", 60)


def test_a_hung_input_and_a_raising_input_are_refused_and_every_other_id_recorded(
        tmp_path: Path) -> None:
    """task.item_timeout_s on the Ray workers: the hung input is interrupted there (no
    worker excluded), both bad inputs are isolated and refused with their reason, the
    volume passes with every id once. The handler is a generator: what it yielded before
    each failure is kept, the input it failed on tried alone, and no other input of
    theirs runs twice (issue 34, point 4)."""
    spec, ids = make_volume(tmp_path, 40, workers=2, batch_size=5)
    raw = json.loads(spec.read_text())
    raw["task"].update(item_timeout_s=1, batch_size=20,  # the memory stage's trial: 0-19
                       handler="volwork:handle_stream")
    raw["task"]["params"].update(hang_id="item-00031", raise_id="item-00026")
    spec.write_text(json.dumps(raw))
    run_dir = tmp_path / "run"
    proc = start_runner(spec, run_dir)
    try:
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    finally:
        kill_group(proc)
    assert sorted(ledger_ids(run_dir)) == ids
    balance = json.loads((run_dir / "balance.json").read_text())
    assert balance["total"] == 40
    refused = {r["id"]: r["reason"] for r in balance["rows"] if r["status"] == "refused"}
    # where the handler raised: in the refusal (file and line), its traceback in the run
    # directory (issue 37, point 6)
    line = next(n for n, text in enumerate(VOLWORK.splitlines(), 1) if "raise ValueError" in text)
    at = f"{tmp_path / 'project' / 'volwork.py'}:{line}"
    assert refused == {
        "item-00000": "multiple of 97",
        "item-00031": "timeout: no result within task.item_timeout_s = 1 s (the handler "
                      "was interrupted on its worker)",
        "item-00026": f"task.handler raised ValueError: cannot read item-00026 (at {at})"}
    kept = [json.loads(x) for x in (run_dir / "handler_errors.jsonl").read_text().splitlines()]
    assert kept and {k["where"] for k in kept} == {at}
    assert "item-00026" in kept[-1]["ids"] and 'raise ValueError("cannot read "' in \
        kept[-1]["traceback"]
    facts = [e for e in events(run_dir) if e.type == "stage.passed"
             and e.data["stage"] == "pilot"][-1].data["facts"]
    assert facts["workers_excluded"] == 0 and facts["refused_alone"] == 2
    splits = [e.data for e in events(run_dir) if e.type == "volume.split" and e.data["parts"]]
    assert sorted((s["suspect"], s["kept"]) for s in splits) == [("item-00026", 1),
                                                                  ("item-00031", 1)]
    runs = collections.Counter(line for log in (tmp_path / "logs").iterdir()
                               for line in log.read_text().split())
    assert {i: runs[i] for i in ids[20:] if runs[i] != 1} == {"item-00026": 0,
                                                              "item-00031": 0}
    worker = [e.data["workers"] for e in events(run_dir) if e.type == "volume.workers"][-1][0]
    assert worker["item_timeout"] == "on"
    wait_until(lambda: not our_actor_pids(run_marker(run_dir)), "the run's actors to end", 60)
