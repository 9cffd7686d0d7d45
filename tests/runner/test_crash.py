"""Crash torture: SIGKILL the pilot at random moments, resume each time, lose nothing.

The kills hit a small driver process that runs the real pilot stage (same code path as
the runner's worker, without the torch ladder, so 20+ kills fit in seconds); the run is
then finished by the real ``python -m runner --resume``. Seeds are printed so a failure
can be replayed.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from runner.events import read_events

REPO = Path(__file__).resolve().parents[2]
N_ITEMS = 3000
KILLS = 22

# Each item costs WORK_S of simulated work, so the 3,000 items take ~12 s of processing
# in all: enough for 22 kills at 0.1-0.8 s however fast or loaded the machine is.
WORK_S = 0.004

HANDLER = r'''
import json, os, sqlite3, time
from runner.workloads import write_output

def handle(items, ctx):
    run_dir = os.path.dirname(ctx.outputs_dir)
    if not os.path.exists(os.path.join(run_dir, "ledger.sqlite")):
        run_dir = None  # a dry run outside the pilot (the memory stage): nothing to check
    return _handle(items, ctx, run_dir) if run_dir else _results(items, ctx)

def _handle(items, ctx, run_dir):
    con = sqlite3.connect("file:" + os.path.join(run_dir, "ledger.sqlite") + "?mode=ro",
                          uri=True)
    asked = [i.id for i in items]
    done = {r[0] for r in con.execute(
        "SELECT id FROM items WHERE id IN (%s)" % ",".join("?" * len(asked)), asked)}
    con.close()
    with open(os.path.join(run_dir, "processed.log"), "a") as log:
        for iid in asked:
            log.write(("VIOLATION " if iid in done else "") + iid + "\n")
    return _results(items, ctx)

def _results(items, ctx):
    out = []
    for it in items:
        time.sleep(WORK_S)  # the item's simulated work
        if int(it.id[1:]) % 10 == 7:
            out.append({"id": it.id, "status": "refused", "reason": "multiple of 7"})
            continue
        write_output(ctx.outputs_dir, it.id, json.dumps({"id": it.id}).encode())
        out.append({"id": it.id, "status": "accepted", "category": "x",
                    "output": os.path.join(ctx.outputs_dir, it.id + ".json")})
    return out
'''

DRIVER = r'''
import sys
from runner.events import EventWriter
from runner.spec import load_spec
from runner.stage import StageContext
from runner.stages.pilot import pilot
run_dir = sys.argv[2]
spec = load_spec(sys.argv[1])
writer = EventWriter.resume(run_dir + "/events.jsonl", spec.run_id)
ctx = StageContext(spec=spec, run_dir=run_dir, resume=True,
                   emit=lambda t, **d: writer.emit(t, **d) and None)
pilot(ctx)
writer.close()
'''


def setup(tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    inputs = tmp / "in"
    inputs.mkdir()
    for k in range(N_ITEMS):
        (inputs / f"i{k:05d}.txt").write_text(str(k))
    (tmp / "crash_handler_l.py").write_text(f"WORK_S = {WORK_S}\n" + HANDLER)
    (tmp / "driver.py").write_text(DRIVER)
    run = tmp / "run"
    run.mkdir()
    spec = {"run_id": "crash", "name": "crash", "backend": "cpu", "project": {"dir": str(tmp)},
            "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": N_ITEMS,
                       "expected_refusals": [f"i{k:05d}" for k in range(N_ITEMS) if k % 10 == 7]},
            "task": {"handler": "crash_handler_l:handle", "categories": ["x"], "batch_size": 16}}
    (run / "spec.json").write_text(json.dumps(spec))
    (run / "manifest.yaml").write_text("name: crash\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{REPO}"}
    return run, run / "spec.json", env


def done_count(run: Path) -> int:
    try:
        con = sqlite3.connect(f"file:{run / 'ledger.sqlite'}?mode=ro", uri=True)
        try:
            return int(con.execute("SELECT count(*) FROM items").fetchone()[0])
        finally:
            con.close()
    except sqlite3.Error:
        return 0


def test_sigkill_at_random_moments_then_resume(tmp_path: Path) -> None:
    run, spec, env = setup(tmp_path)
    master = random.randrange(1 << 30)
    print(f"crash torture master seed {master}")
    rng = random.Random(master)
    kills = 0
    errlog = open(tmp_path / "driver.err", "ab")
    while kills < KILLS:
        seed = rng.randrange(1 << 30)
        delay = random.Random(seed).uniform(0.1, 0.8)
        proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(spec),
                                 str(run)], env=env, stderr=errlog)
        try:
            proc.wait(timeout=delay)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
            kills += 1
            print(f"kill {kills}: seed {seed} after {delay:.3f} s, {done_count(run)} done")
            continue
        assert proc.returncode == 0, (tmp_path / "driver.err").read_text()
        break  # finished before the kill: the remaining kills have nothing to hit
    errlog.close()
    assert kills >= 20
    # finish whatever the last kill left
    subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(spec), str(run)],
                   env=env, check=True, timeout=120)
    check_exactly_once(run)
    final = subprocess.run([sys.executable, "-m", "runner", str(spec), "--run-dir", str(run),
                            "--resume"], env=env, capture_output=True, text=True, timeout=300)
    events = [json.loads(x) for x in final.stdout.splitlines() if x.startswith("{")]
    pilot = [e for e in events if e["type"] == "stage.passed" and e["stage"] == "pilot"]
    assert pilot and pilot[0]["facts"]["remaining"] == 0, final.stdout[-3000:] + final.stderr
    bal = [e for e in events if e["type"] == "balance"][0]
    assert bal["ok"] and bal["accepted"] + bal["refused"] == N_ITEMS == bal["total"]
    assert final.returncode == 0


def check_exactly_once(run: Path) -> None:
    con = sqlite3.connect(str(run / "ledger.sqlite"))
    rows = con.execute("SELECT id, status, output FROM items").fetchall()
    con.close()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == N_ITEMS
    assert set(ids) == {f"i{k:05d}" for k in range(N_ITEMS)}
    accepted = {r[0] for r in rows if r[1] == "accepted"}
    refused = {r[0] for r in rows if r[1] == "refused"}
    assert len(accepted) + len(refused) == N_ITEMS
    outputs = {p.stem for p in (run / "outputs").iterdir() if not p.name.startswith(".")}
    assert outputs == accepted
    for r in rows:
        if r[1] == "accepted":
            assert json.loads((run / r[2]).read_text()) == {"id": r[0]}
    log = (run / "processed.log").read_text().split("\n")
    assert not [ln for ln in log if ln.startswith("VIOLATION")]
    done_events = [e.data["id"] for e in read_events(str(run / "events.jsonl"))[0]
                   if e.type == "item.done"]
    assert sorted(done_events) == sorted(ids)  # every ledger item's event exactly once
