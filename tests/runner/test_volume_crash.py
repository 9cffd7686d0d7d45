"""Crash torture of the volume's outputs: SIGKILL the driver at random moments, resume each
time: 0 lost, 0 doubled, every accepted input's output found by its id.

The killed process runs the real driver (``runner.volume_driver.Driver``, its recording thread,
the pilot stage's ``Recorder`` and the ledger) over the real worker class
(``runner.volume_ray._Worker``: the handler, then the batch's shard written on "its
node") through a small in-process stand-in for Ray's calls, so a kill lands anywhere:
in the handler, in a shard's write or rename, between the shard and the ledger's commit,
in the commit, in an event. The real engine is tested on Ray in tests/volume/.
"""

from __future__ import annotations

import json
import os
import random
import signal
import sqlite3
import subprocess
import sys
from collections import Counter
from pathlib import Path

from runner.outputs import parse_ref, read_output
from tests.processes import wait_until
from tests.runner.test_crash import done_count

REPO = Path(__file__).resolve().parents[2]
N_ITEMS = 800
KILLS = 10
WORK_S = 0.003  # about 2.4 s of work in all, done over the kills

HANDLER = r'''
import os, sqlite3, time

def handle(items, ctx):
    run_dir = os.path.dirname(ctx.outputs_dir)
    con = sqlite3.connect("file:" + os.path.join(run_dir, "ledger.sqlite") + "?mode=ro",
                          uri=True)
    asked = [i.id for i in items]
    done = {r[0] for r in con.execute(
        "SELECT id FROM items WHERE id IN (%s)" % ",".join("?" * len(asked)), asked)}
    con.close()
    with open(os.path.join(run_dir, "processed.log"), "a") as log:
        log.write("".join(("VIOLATION " if i in done else "") + i + "\n" for i in asked))
    out = []
    for it in items:
        time.sleep(WORK_S)
        k = int(it.id[1:])
        out.append({"id": it.id, "status": "refused", "reason": "multiple of 7"} if k % 7 == 0
                   else {"id": it.id, "status": "accepted", "category": "x",
                         "output": {"k": k, "text": "x" * (k % 50)}})
    return out
'''

DRIVER = r'''
import sys, types
# the actor asks Ray only which CPUs it was given: a stand-in module answers one
sys.modules["ray"] = types.SimpleNamespace(get_runtime_context=lambda: types.SimpleNamespace(
    get_assigned_resources=lambda: {"CPU": 1.0}))
from runner.events import EventWriter
from runner.spec import load_spec
from runner.stage import StageContext
from runner.stages.pilot import Recorder, list_stage_inputs, open_ledger
from runner.volume_driver import Driver
from runner.volume_queue import Batch
from runner.volume_workers import Worker
from runner.volume_ray import _Worker

class Ref:
    def __init__(self, reply):
        self.reply = reply

class Actor:
    """A worker's calls, run at once in this process (as Ray would on its node)."""
    def __init__(self, worker):
        self.run = types.SimpleNamespace(remote=lambda payload: Ref(worker.run(payload)))

class Ray:
    exceptions = types.SimpleNamespace()
    def wait(self, refs, num_returns, timeout):
        return list(refs), []
    def get(self, ref):
        return ref.reply
    def kill(self, actor, no_restart=True):
        pass
    def nodes(self):
        return [{"NodeID": "n0", "Alive": True}]

run_dir = sys.argv[2]
spec = load_spec(sys.argv[1])
writer = EventWriter.resume(run_dir + "/events.jsonl", spec.run_id)
ctx = StageContext(spec=spec, run_dir=run_dir, resume=True,
                   emit=lambda t, **d: writer.emit(t, **d) and None)
items = list_stage_inputs(spec, "pilot")
ledger = open_ledger(ctx, "pilot")
done = ledger.done_ids()
recorder = Recorder(ctx, ledger, items, done)
remaining = [it for it in items if it.id not in done]
batches = [Batch(n, remaining[i:i + 16]) for n, i in enumerate(range(0, len(remaining), 16))]
workers = [Worker(k, Actor(_Worker(spec.to_dict(), run_dir + "/outputs", list(sys.path), "cpu",
                                   "a%d-w%d" % (ledger.attempt, k))), node="n0", host="h")
           for k in range(2)]
Driver(ctx, recorder, Ray(), workers, batches, 0, in_flight=2).run()
ledger.close()
writer.close()
'''


def _setup(tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    inputs = tmp / "in"
    inputs.mkdir()
    for k in range(N_ITEMS):
        (inputs / f"i{k:05d}.txt").write_text(str(k))
    (tmp / "vol_crash_handler.py").write_text(f"WORK_S = {WORK_S}\n" + HANDLER)
    (tmp / "driver.py").write_text(DRIVER)
    run = tmp / "run"
    (run / "outputs").mkdir(parents=True)
    spec = {"run_id": "vcrash", "name": "vcrash", "backend": "cpu",
            "project": {"dir": str(tmp)},
            "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": N_ITEMS},
            "task": {"handler": "vol_crash_handler:handle", "categories": ["x"],
                     "batch_size": 16}}
    (run / "spec.json").write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": f"{tmp}{os.pathsep}{REPO}"}
    return run, run / "spec.json", env


def _ran(run: Path) -> int:
    """Bytes of the handlers' log: grows as soon as a batch ran."""
    try:
        return (run / "processed.log").stat().st_size
    except FileNotFoundError:
        return 0


def test_sigkill_at_random_moments_loses_and_doubles_no_output(tmp_path: Path) -> None:
    run, spec, env = _setup(tmp_path)
    master = random.randrange(1 << 30)
    print(f"volume crash torture master seed {master}")
    rng = random.Random(master)
    kills = 0
    counts: list[int] = []
    with open(tmp_path / "driver.err", "ab") as errlog:
        while kills < KILLS:
            delay = rng.uniform(0.0, 0.4)
            ran = _ran(run)
            proc = subprocess.Popen([sys.executable, str(tmp_path / "driver.py"), str(spec),
                                     str(run)], env=env, stderr=errlog)
            # however long the interpreter takes to start on a loaded machine, the kill
            # lands once this attempt's handler has run (then a random moment later)
            wait_until(lambda p=proc, before=ran: p.poll() is not None or _ran(run) > before,
                       "the driver's first batch", 120)
            try:
                proc.wait(timeout=delay)
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                kills += 1
                counts.append(done_count(run))
                continue
            assert proc.returncode == 0, (tmp_path / "driver.err").read_text()[-3000:]
            break
    subprocess.run([sys.executable, str(tmp_path / "driver.py"), str(spec), str(run)],
                   env=env, check=True, timeout=120)
    print(f"items recorded at each kill: {counts}")
    assert kills >= KILLS // 2 and len(set(counts)) >= 2, counts  # kills in mid-pass
    con = sqlite3.connect(str(run / "ledger.sqlite"))
    rows = con.execute("SELECT id, status, output FROM items").fetchall()
    con.close()
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids)) == N_ITEMS  # 0 doubled, 0 lost in the ledger
    for iid, status, output in rows:
        k = int(iid[1:])
        if k % 7 == 0:
            assert (status, output) == ("refused", None)
            continue
        # every accepted input's output complete, under its final name, found by its id
        assert read_output(str(run), output, iid) == {"k": k, "text": "x" * (k % 50)}
    refs = Counter(parse_ref(r[2]) for r in rows if r[2])
    assert all(n == 1 for n in refs.values())  # no two inputs point at one line
    shards = run / "outputs" / "shards"
    lines = [json.loads(x)["id"] for p in shards.glob("*.jsonl")
             for x in p.read_text().splitlines()]
    assert set(lines) == {i for i in ids if int(i[1:]) % 7}  # a line per accepted input,
    # more than one only for an input whose batch's shard was written before a kill and
    # never recorded: its output is then the one the ledger names (docs/volume.md)
    log = (run / "processed.log").read_text().split("\n")
    assert not [ln for ln in log if ln.startswith("VIOLATION")]  # nothing done ran again
