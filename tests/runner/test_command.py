"""External command tasks: the user's program writes a results file; the runner audits it."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from runner.events import EventWriter, read_events
from runner.ledger import Ledger
from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages import balance as balance_stage
from runner.stages import pilot as pilot_stage

PROGRAM = r'''
import json, os, sys
inputs, results, outputs, mode = sys.argv[1:5]
names = sorted(os.listdir(inputs))
with open(results, "w") as fh:
    for name in names:
        iid = name.rsplit(".", 1)[0]
        if mode == "drop" and iid == "c":
            continue
        rec = {"id": iid, "status": "accepted", "category": "x"}
        if iid == "b":
            rec = {"id": iid, "status": "refused", "reason": "empty"}
        if mode == "badcat" and iid == "a":
            rec["category"] = "zzz"
        if mode == "timed" and iid != "d":
            rec["elapsed_s"] = {"a": 0.5, "b": 0, "c": "slow"}[iid]
        fh.write(json.dumps(rec) + "\n")
        if mode == "dup" and iid == "a":
            fh.write(json.dumps(rec) + "\n")
    if mode == "invent":
        fh.write(json.dumps({"id": "ghost", "status": "accepted", "category": "x"}) + "\n")
    if mode == "garbage":
        fh.write("this is not json\n")
if mode == "crash":
    sys.exit(3)
if mode == "threads":
    with open(os.path.join(outputs, "omp.txt"), "w") as fh:
        fh.write(os.environ.get("OMP_NUM_THREADS", "unset"))
'''


def run_pilot(tmp: Path, mode: str, resume: bool = False,
              torch_threads: int | None = None) -> tuple[StageContext, Any]:
    (tmp / "in").mkdir(exist_ok=True)
    for name in "abcd":
        (tmp / "in" / f"{name}.txt").write_text(name)
    (tmp / "prog.py").write_text(PROGRAM)
    run = tmp / "run"
    run.mkdir(exist_ok=True)
    spec = RunSpec.from_dict({
        "run_id": "r", "name": "t", "project": {"dir": str(tmp)},
        "inputs": {"dir": str(tmp / "in"), "pattern": "*.txt", "expected_count": 4,
                   "expected_refusals": ["b"]},
        "task": {"kind": "custom", "categories": ["x", "y"], "torch_threads": torch_threads,
                 "command": [sys.executable, "prog.py", "{inputs}", "{results}", "{outputs}",
                             mode]}})
    writer = (EventWriter.resume if resume else EventWriter)(str(run / "events.jsonl"), "r")
    ctx = StageContext(spec=spec, run_dir=str(run), resume=resume,
                       emit=lambda t, **d: writer.emit(t, **d) and None)
    try:
        facts = pilot_stage.pilot(ctx)
    finally:
        writer.close()
    return ctx, facts


def balance_problems(ctx: StageContext) -> list[tuple[str, Any]]:
    try:
        balance_stage.balance(StageContext(spec=ctx.spec, run_dir=ctx.run_dir))
    except StageFailure:
        pass
    doc = json.loads(Path(ctx.run_dir, "balance.json").read_text())
    return [(p["kind"], p["id"]) for p in doc["problems"]]


def test_a_well_behaved_command(tmp_path: Path) -> None:
    ctx, facts = run_pilot(tmp_path, "ok")
    assert facts["exit_code"] == 0 and facts["recorded"] == 4
    assert balance_problems(ctx) == []


def test_the_command_gets_the_threads_its_worker_owns_unless_told(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from runner.threads import owned_cores

    def seen(path: Path) -> str:
        return next(path.glob("run/outputs/omp.txt")).read_text()

    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    (tmp_path / "a").mkdir()
    _, facts = run_pilot(tmp_path / "a", "threads")
    assert seen(tmp_path / "a") == str(owned_cores()[0]) == str(facts["torch_threads"])
    assert "cores the worker owns" in facts["torch_threads_why"]
    (tmp_path / "b").mkdir()
    _, facts = run_pilot(tmp_path / "b", "threads", torch_threads=3)
    assert seen(tmp_path / "b") == "3" and facts["torch_threads_why"].startswith(
        "task.torch_threads")
    monkeypatch.setenv("OMP_NUM_THREADS", "7")  # the node's own setting is left as it is
    (tmp_path / "c").mkdir()
    _, facts = run_pilot(tmp_path / "c", "threads")
    assert seen(tmp_path / "c") == "7" and "already set" in facts["torch_threads_why"]


@pytest.mark.parametrize("mode,expected", [
    ("invent", [("invented", "ghost")]),
    ("dup", [("duplicate", "a")]),
    ("drop", [("missing", "c"), ("count_mismatch", None)]),
    ("badcat", [("bad_category", "a")]),
    ("garbage", [("bad_id", None)]),
])
def test_each_results_problem_is_named(tmp_path: Path, mode: str, expected: list) -> None:
    ctx, _ = run_pilot(tmp_path, mode)
    assert balance_problems(ctx) == expected


def test_a_failing_command_keeps_its_results_and_resume_runs_only_the_rest(
        tmp_path: Path) -> None:
    with pytest.raises(StageFailure, match="task.command exited with 3"):
        run_pilot(tmp_path, "crash")
    with Ledger.open(str(tmp_path / "run" / "ledger.sqlite")) as led:
        assert led.count() == 4
    (tmp_path / "in" / "e.txt").write_text("e")
    ctx, facts = run_pilot(tmp_path, "ok", resume=True)
    assert (facts["already_done"], facts["remaining"], facts["recorded"]) == (4, 1, 1)
    linked = sorted(p.name for p in (tmp_path / "run" / "command" / "attempt-2" / "inputs")
                    .iterdir())
    assert linked == ["e.txt"]


def test_a_command_that_cannot_start(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.txt").write_text("a")
    spec = RunSpec.from_dict({"run_id": "r", "name": "t",
                              "inputs": {"dir": str(tmp_path / "in")},
                              "task": {"command": ["/nonexistent/prog-l"], "categories": ["x"]}})
    ctx = StageContext(spec=spec, run_dir=str(tmp_path))
    with pytest.raises(StageFailure, match="'/nonexistent/prog-l' cannot start"):
        pilot_stage.pilot(ctx)


def test_per_item_seconds_a_command_reports_are_kept_and_nothing_is_invented(
        tmp_path: Path) -> None:
    ctx, _ = run_pilot(tmp_path, "timed")
    done = {e.data["id"]: e.data for e in read_events(str(Path(ctx.run_dir, "events.jsonl")))[0]
            if e.type == "item.done"}
    assert done["a"]["elapsed_s"] == 0.5 and done["b"]["elapsed_s"] == 0
    # not a number, or not reported: no timing rather than a guess
    assert "elapsed_s" not in done["c"] and "elapsed_s" not in done["d"]
    assert {k: v["input_bytes"] for k, v in done.items()} == {"a": 1, "b": 1, "c": 1, "d": 1}
