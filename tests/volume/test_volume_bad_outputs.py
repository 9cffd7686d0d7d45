"""Bad outputs on the volume's path: refused by the worker that wrote the batch's shard.

The real worker actor on a local Ray (runner.volume_ray's _Worker: the handler, then the
batch's outputs in one shard on its node) and the real driver (runner.volume.Driver, its
recording thread, the ledger): an output that is not JSON, a path output outside the
outputs folder and an output over the size cap refuse their input with the reason; the
rest of the batch is recorded once, its outputs found by id; the batch is neither split
nor run again (issue 34).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.inputs import list_dir
from runner.ledger import Ledger
from runner.outputs import MAX_OUTPUT_BYTES, read_output
from runner.spec import RunSpec
from runner.stage import StageContext
from runner.stages.pilot import Recorder

HANDLER = '''
import os

def handle(items, ctx):
    with open(os.path.join(ctx.params["log"], "calls-%d" % os.getpid()), "a") as fh:
        fh.write(" ".join(it.id for it in items) + "\\n")
    out = []
    for it in items:
        res = {"id": it.id, "status": "accepted", "category": "x"}
        if it.id == "set":
            res["output"] = {"s": {1, 2}}                       # not JSON
        elif it.id == "nan":
            res["output"] = [float("nan")]                      # not JSON either
        elif it.id == "big":
            res["output"] = {"t": "y" * (ctx.params["cap"] + 1)}  # over the size cap
        elif it.id == "away":
            res["output"] = "/etc/passwd"                       # outside the outputs folder
        elif it.id == "up":
            res["output"] = "outputs/../spec.json"              # outside, through ..
        elif it.id == "file":
            path = os.path.join(ctx.outputs_dir, "file.txt")    # a file it wrote itself
            with open(path, "w") as fh:
                fh.write("mine")
            res["output"] = path
        else:
            res["output"] = {"id": it.id, "score": 0.5}
        out.append(res)
    return out
'''
BAD = {"set": "output is not JSON (TypeError", "nan": "output is not JSON (ValueError",
       "big": f"over the {MAX_OUTPUT_BYTES} bytes an output may have",
       "away": "lies outside the outputs folder", "up": "lies outside the outputs folder"}
GOOD = ["g1", "g2", "g3"]


def test_a_bad_output_refuses_its_input_and_the_rest_of_its_batch_is_recorded(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner import volume_ray
    from runner.volume_driver import Driver
    from runner.volume_queue import Batch
    from runner.volume_workers import start_workers, worker_factory
    from tests.volume.kit import cluster_env

    inputs, log = tmp_path / "inputs", tmp_path / "log"
    inputs.mkdir()
    log.mkdir()
    ids = sorted([*BAD, "file", *GOOD])
    for iid in ids:
        (inputs / f"{iid}.txt").write_text("x")
    (tmp_path / "badwork.py").write_text(HANDLER)
    spec = RunSpec.from_dict({
        "run_id": "bad-outputs", "name": "bad-outputs", "project": {"dir": str(tmp_path)},
        "inputs": {"dir": str(inputs), "pattern": "*.txt", "expected_count": len(ids)},
        "task": {"handler": "badwork:handle", "categories": ["x"], "batch_size": len(ids),
                 "params": {"log": str(log), "cap": MAX_OUTPUT_BYTES}},
        "volume": {"workers": 1, "batch_size": len(ids)}})
    assert spec.volume is not None
    run_dir = tmp_path / "run"
    (run_dir / "outputs").mkdir(parents=True)  # as the pilot stage makes it
    ctx = StageContext(spec=spec, run_dir=str(run_dir))
    items = list_dir(spec.inputs.dir, spec.inputs.pattern)
    ledger = Ledger.open(str(run_dir / "ledger.sqlite"), new_attempt=True)
    # the process's one Ray token (tests/volume/kit.py): prepare_env would make a new one,
    # and Ray reads it once a process, so a later cluster test here could not start its GCS
    for name, value in cluster_env().items():
        monkeypatch.setenv(name, value)
    ray = volume_ray.import_ray()
    volume_ray.start(ray, spec.volume, str(run_dir), 1)
    try:
        spawn = worker_factory(ctx, ray, spec.volume)
        workers = start_workers(ctx, ray, spec.volume, 1, spawn)
        facts = Driver(ctx, Recorder(ctx, ledger, items, set()), ray, workers,
                       [Batch(0, items)], 0.0, spawn=spawn).run()
        for w in workers:
            ray.kill(w.actor)
    finally:
        volume_ray.stop(ray, [], str(run_dir))
    rows = {row.id: row for row in ledger.rows()}
    ledger.close()
    assert sorted(rows) == ids  # every input once
    for iid, why in BAD.items():
        assert (rows[iid].status, rows[iid].output) == ("refused", None), iid
        assert why in (rows[iid].reason or ""), (iid, rows[iid].reason)
    assert (rows["file"].status, rows["file"].output) == ("accepted", "outputs/file.txt"), \
        rows["file"].reason
    for iid in GOOD:  # the rest of the batch: recorded, each output found by its id
        assert rows[iid].status == "accepted"
        assert read_output(str(run_dir), str(rows[iid].output), iid) == {"id": iid,
                                                                        "score": 0.5}
    shards = list((run_dir / "outputs" / "shards").iterdir())
    assert len(shards) == 1 and len(shards[0].read_text().splitlines()) == len(GOOD)
    calls = [line.split() for p in log.iterdir() for line in p.read_text().splitlines()]
    assert calls == [ids]  # one call: the batch was neither split nor run again
    assert facts["batches_split"] == 0 and facts["refused_alone"] == 0
