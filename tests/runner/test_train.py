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
from runner.inputs import list_inputs
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages import balance as balance_stage
from runner.stages import pilot as pilot_stage
from runner.workloads import make_context
from runner.workloads.train import handle

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # this torch build warns that numpy is absent
    import torch  # noqa: F401

REPO = Path(__file__).resolve().parents[2]


def run_train(tmp: Path, trainer: str | None = None,
              **params: Any) -> tuple[StageContext, dict[str, Any]]:
    run = tmp / "run"
    run.mkdir()
    task: dict[str, Any] = {"kind": "train", "params": params}
    if trainer is not None:
        task["trainer"] = trainer
    spec = RunSpec.from_dict({
        "run_id": "t1", "name": "train", "purpose": "training",
        "project": {"dir": str(tmp)},
        "inputs": {"dir": str(REPO / "data/train"), "pattern": "shard-*.csv",
                   "expected_count": 4},
        "task": task,
        "training": {"steps": 3, "resume_steps": 2, "seed": 7}})
    writer = EventWriter(str(run / "events.jsonl"), "t1")
    ctx = StageContext(spec=spec, run_dir=str(run),
                       emit=lambda t, **d: writer.emit(t, **d) and None)
    try:
        return ctx, pilot_stage.pilot(ctx)
    finally:
        writer.close()


def test_resume_in_a_new_process_is_bit_identical(tmp_path: Path) -> None:
    ctx, facts = run_train(tmp_path)
    assert facts["bit_identical"] is True and facts["differences"] == []
    assert facts["seed"] == 7
    assert facts["losses_a"][3:] == facts["losses_c"] and len(facts["losses_a"]) == 5
    ck = tmp_path / "run" / "checkpoints" / "step-3"
    assert json.loads((ck / "COMPLETE").read_text())["step"] == 3
    bal = balance_stage.balance(StageContext(spec=ctx.spec, run_dir=ctx.run_dir))
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


# A user's trainer, unlike the example: a linear model, SGD with momentum, no scheduler,
# examples as one tensor, torch noise in the step, one shard refused on purpose.
USER_TRAINER = """
import csv

import torch


class LinearTrainer:
    batch_size = 8

    def read(self, items, params):
        rows, refused = [], {}
        for item in items:
            if item.id == params.get("refuse"):
                refused[item.id] = "refused on purpose"
                continue
            with open(item.path, newline="") as fh:
                reader = csv.reader(fh)
                next(reader)
                rows += [[float(v) for v in rec] for rec in reader if rec]
        return torch.tensor(rows), refused

    def build(self, seed, params, device):
        model = torch.nn.Linear(6, 1).to(device)
        return model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), None

    def step(self, model, optimizer, batch, device):
        x, y = batch[:, :6].to(device), batch[:, 6:].to(device)
        loss = torch.nn.functional.mse_loss(model(x + 0.01 * torch.randn_like(x)), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        return loss
"""


def test_a_user_trainer_passes_the_resume_test_and_reports_refusals(tmp_path: Path) -> None:
    (tmp_path / "team_linear.py").write_text(USER_TRAINER)
    ctx, facts = run_train(tmp_path, "team_linear:LinearTrainer", refuse="shard-04")
    assert facts["trainer"] == "team_linear:LinearTrainer"
    assert facts["bit_identical"] is True and facts["straight_identical"] is True
    assert facts["shards"] == 3 and facts["examples"] == 3 * 48
    assert facts["losses_a"][3:] == facts["losses_c"] and len(facts["losses_c"]) == 2
    state = torch.load(tmp_path / "run/checkpoints/step-3/state.pt", weights_only=False)
    assert set(state["model"]) == {"weight", "bias"} and state["scheduler"] is None
    assert state["trainer"] == "team_linear:LinearTrainer" and state["step"] == 3
    bal = balance_stage.balance(StageContext(spec=ctx.spec, run_dir=ctx.run_dir))
    assert (bal["accepted"], bal["refused"], bal["total"]) == (3, 1, 4)
    rows = json.loads((tmp_path / "run" / "balance.json").read_text())["rows"]
    refused = [r for r in rows if r["status"] == "refused"]
    assert [(r["id"], r["reason"]) for r in refused] == [("shard-04", "refused on purpose")]
    # the handler form the memory stage measures runs the same trainer for one step
    wctx = make_context(ctx.spec, str(tmp_path / "scratch"))
    out = handle(list_inputs(ctx.spec), wctx)
    assert [(r["id"], r["status"]) for r in out] == [
        ("shard-01", "accepted"), ("shard-02", "accepted"), ("shard-03", "accepted"),
        ("shard-04", "refused")]


def test_a_non_deterministic_trainer_is_caught_with_the_tensors_named(tmp_path: Path) -> None:
    noisy = USER_TRAINER.replace("import csv", "import csv\nimport random").replace(
        "loss = torch.nn.functional.mse_loss(model(x + 0.01 * torch.randn_like(x)), y)",
        "loss = torch.nn.functional.mse_loss(model(x), y) * (1 + random.Random().random())")
    (tmp_path / "team_noisy.py").write_text(noisy)
    with pytest.raises(StageFailure, match="not deterministic") as err:
        run_train(tmp_path, "team_noisy:LinearTrainer")
    assert err.value.error_type == "NonDeterministic"
    names = {d["tensor"] for d in err.value.facts["straight_differences"]}
    assert {"losses", "model.weight", "model.bias"} <= names
    assert "model.weight (max |diff|" in str(err.value)
    assert not (tmp_path / "run/checkpoints/C.json").exists()  # C was never started


@pytest.mark.parametrize(("module", "source", "expected"), [
    ("team_absent", None, "cannot import module 'team_absent'"),
    ("team_broken", "import not_installed_dependency_xyz\n",
     "cannot import module 'team_broken': No module named 'not_installed_dependency_xyz'"),
    ("team_partial", "def read(items, params):\n    return [], {}\n", "missing build, step"),
])
def test_a_trainer_that_cannot_be_loaded_fails_the_stage_naming_it(
        tmp_path: Path, module: str, source: str | None, expected: str) -> None:
    if source is not None:
        (tmp_path / f"{module}.py").write_text(source)
    with pytest.raises(StageFailure) as err:
        run_train(tmp_path, module)
    assert f"task.trainer {module}" in str(err.value) and expected in str(err.value)
    assert err.value.error_type == "TrainerError"
