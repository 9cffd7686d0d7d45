"""A shared three-node Ray cluster (ray.cluster_utils.Cluster, fake cards) and a volume
project of a few thousand inputs, for the volume's engine tests."""

from __future__ import annotations

import json
import os
import secrets
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

from runner.events import Event, read_events
from tests.processes import live_processes
from tests.runner.test_stages_kit import REPO, runner_env

VOLWORK = '''
import os, time

def handle(items, ctx):
    p = ctx.params
    out = []
    for it in items:
        if it.id == p.get("hang_id"):
            time.sleep(3600)                             # an input that never finishes
        if it.id == p.get("raise_id"):
            raise ValueError("cannot read " + it.id)     # an input the handler fails on
        if it.id == p.get("slow_id") and not os.path.exists(p["slow_marker"]):
            open(p["slow_marker"], "w").close()
            time.sleep(float(p.get("slow_s", 4)))   # this worker holds its batch too long
        if p.get("delay_s") and not os.path.exists(p.get("fast_marker", "")):
            time.sleep(float(p["delay_s"]))          # stands in for device time
        n = int(it.id.split("-")[1])
        out.append({"id": it.id, "status": "accepted", "category": "even" if n % 2 == 0
                    else "odd"} if n % 97 else {"id": it.id, "status": "refused",
                                                 "reason": "multiple of 97"})
        if p.get("outputs") and n % 97:
            out[-1]["output"] = {"n": n, "pid": os.getpid()}  # a small JSON output
    if p.get("log_dir"):
        with open(os.path.join(p["log_dir"], "%s-%d.log" % (p.get("tag", "x"), os.getpid())),
                  "a") as fh:
            fh.write("".join(it.id + "\\n" for it in items))
    return out


def handle_stream(items, ctx):
    for it in items:                                 # a generator: one result at a time
        yield from handle([it], ctx)
'''


def make_volume(root: Path, count: int, **volume: Any) -> tuple[Path, list[str]]:
    """A project with ``count`` inputs and a volume spec; returns (spec path, ids)."""
    project = root / "project"
    inputs = project / "inputs"
    inputs.mkdir(parents=True, exist_ok=True)
    ids = [f"item-{i:05d}" for i in range(count)]
    for iid in ids:
        (inputs / f"{iid}.txt").write_text(iid)
    (project / "volwork.py").write_text(VOLWORK)
    (root / "logs").mkdir(exist_ok=True)
    refusals = [i for i in ids if int(i.split("-")[1]) % 97 == 0]
    spec = {"run_id": "r-vol", "name": "vol", "backend": "cpu", "python": ">=3.9",
            "project": {"dir": str(project)},
            "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": count,
                       "expected_refusals": refusals},
            "task": {"kind": "classify", "handler": "volwork:handle",
                     "categories": ["even", "odd"], "batch_size": 25,
                     "params": {"log_dir": str(root / "logs"), "tag": "first"}},
            "diagnostics": {"timeouts": {}, "min_free_disk_gib": 0},
            "volume": volume}
    path = root / "spec.json"
    path.write_text(json.dumps(spec))
    return path, ids


def set_params(spec_path: Path, **params: Any) -> None:
    spec = json.loads(spec_path.read_text())
    spec["task"]["params"].update(params)
    spec_path.write_text(json.dumps(spec))


# Set in the environment of a runner a test starts: a local Ray's processes inherit it
# from the driver, so a test tells its own actors from another test's (our_actor_pids).
RUN_MARKER = "PREFLIGHT_TEST_RUN"


def run_marker(run_dir: Path) -> str:
    return f"{RUN_MARKER}={run_dir}"


def start_runner(spec: Path, run_dir: Path, *args: str,
                 env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    with open(run_dir.parent / f"{run_dir.name}.log", "a") as log:  # the child keeps a copy
        return subprocess.Popen([sys.executable, "-m", "runner", str(spec), "--run-dir",
                                 str(run_dir), *args], stdout=subprocess.DEVNULL, stderr=log,
                                text=True, env={**(env or runner_env()),
                                                RUN_MARKER: str(run_dir)},
                                cwd=REPO, start_new_session=True)


def events(run_dir: Path) -> list[Event]:
    path = run_dir / "events.jsonl"
    return read_events(str(path))[0] if path.exists() else []


def progress_done(run_dir: Path) -> int:
    done = [int(e.data["done"]) for e in events(run_dir) if e.type == "progress"]
    return max(done) if done else 0


def ledger_ids(run_dir: Path) -> list[str]:
    con = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
    try:
        return [r[0] for r in con.execute("SELECT id FROM items")]
    finally:
        con.close()


def executed(root: Path, tag: str) -> list[str]:
    out: list[str] = []
    for log in sorted((root / "logs").glob(f"{tag}-*.log")):
        out += log.read_text().split()
    return out


def kill_group(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


_TOKEN: list[str] = []


def cluster_env() -> dict[str, str]:
    """Environment for a cluster test: token authentication with a token made here, one
    per test process (Ray reads it once a process: a second cluster started with another
    token in the same process fails to start its GCS)."""
    if not _TOKEN:
        _TOKEN.append(secrets.token_hex(32))
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": _TOKEN[0],
            "RAY_USAGE_STATS_ENABLED": "0"}


def our_actor_pids(marker: str) -> list[int]:
    """Processes of our volume's actors (Ray names an actor's process ray::_Worker) whose
    environment holds ``marker`` (``KEY=VALUE``: ``run_marker`` of a local volume's run,
    the cluster's token for a cluster's actors): another test's Ray, a pilot's calibration
    running beside this test, is not ours."""
    wanted = marker.encode()
    out = []
    for p in live_processes():
        if not p.cmdline.startswith(b"ray::_Worker"):
            continue
        try:
            with open(f"/proc/{p.pid}/environ", "rb") as fh:
                if wanted in fh.read().split(b"\0"):
                    out.append(p.pid)
        except OSError:  # ended while we looked
            continue
    return out
