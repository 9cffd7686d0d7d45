"""Training pilot: the resume test in new processes A, B, C, bit for bit on CPU."""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from runner.events import EventWriter
from runner.spec import RunSpec
from runner.stages import StageContext, StageFailure
from runner.stages import pilot_stages as ps

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # this torch build warns that numpy is absent
    import torch  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def run_train(tmp: Path, **params: Any) -> tuple[StageContext, dict[str, Any]]:
    run = tmp / "run"
    run.mkdir()
    spec = RunSpec.from_dict({
        "run_id": "t1", "name": "train", "purpose": "training",
        "inputs": {"dir": str(REPO / "data/train"), "pattern": "shard-*.csv",
                   "expected_count": 4},
        "task": {"kind": "train", "params": params},
        "training": {"steps": 3, "resume_steps": 2, "seed": 7}})
    writer = EventWriter(str(run / "events.jsonl"), "t1")
    ctx = StageContext(spec=spec, run_dir=str(run),
                       emit=lambda t, **d: writer.emit(t, **d) and None)
    try:
        return ctx, ps.pilot(ctx)
    finally:
        writer.close()


def test_resume_in_a_new_process_is_bit_identical(tmp_path: Path) -> None:
    ctx, facts = run_train(tmp_path)
    assert facts["bit_identical"] is True and facts["differences"] == []
    assert facts["seed"] == 7
    assert facts["losses_a"][3:] == facts["losses_c"] and len(facts["losses_a"]) == 5
    ck = tmp_path / "run" / "checkpoints" / "step-3"
    assert json.loads((ck / "COMPLETE").read_text())["step"] == 3
    bal = ps.balance(StageContext(spec=ctx.spec, run_dir=ctx.run_dir))
    assert (bal["accepted"], bal["total"], bal["ok"]) == (4, 4, True)


def test_a_resume_that_forgets_the_rng_is_caught(tmp_path: Path) -> None:
    with pytest.raises(StageFailure, match="differs from the straight run") as err:
        run_train(tmp_path, break_resume_rng=True)
    assert "losses" in str(err.value) and "model." in str(err.value)
    names = [d["tensor"] for d in err.value.facts["differences"]]
    assert "losses" in names


def test_an_incomplete_checkpoint_is_refused(tmp_path: Path) -> None:
    import subprocess

    from runner.workloads.train import CheckpointError, load_checkpoint

    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "state.pt").write_bytes(b"half a checkpoint")
    with pytest.raises(CheckpointError, match="no valid COMPLETE marker"):
        load_checkpoint(str(tmp_path / "ck"))
    (tmp_path / "ck" / "COMPLETE").write_text(json.dumps({"sha256": "0" * 64, "step": 1}))
    with pytest.raises(CheckpointError, match="does not match"):
        load_checkpoint(str(tmp_path / "ck"))
    assert subprocess.run([sys.executable, "-c", "import runner.workloads.train"],
                          env={**os.environ, "PYTHONPATH": str(REPO)}).returncode == 0
