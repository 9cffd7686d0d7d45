"""``python -m runner`` end to end on a tiny CPU pilot: events, exit codes, run directory."""

from __future__ import annotations

import json
from pathlib import Path

from runner.events import OPTIONAL_STAGES, STAGES
from tests.runner.test_stages_kit import (
    events_of,
    finished,
    outcomes,
    run_runner,
    status_of,
    write_spec,
)

RUN_STAGES = [s for s in STAGES if s not in OPTIONAL_STAGES]


def test_full_ladder_passes_then_the_directory_is_never_reused(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "runs" / "r1"
    done = run_runner(spec, run_dir)
    assert done.returncode == 0, done.stderr
    events = events_of(run_dir)
    status = status_of(events)
    assert list(status) == RUN_STAGES
    assert status["extensions"] == "skipped"
    assert outcomes(events)["extensions"].data["reason"] == "none listed"
    assert outcomes(events)["extensions"].data["blocking"] is False
    passed = {name for name, s in status.items() if s == "passed"}
    assert passed >= {"prepare", "interpreter", "environment", "torch", "device", "compute",
                      "memory", "pilot", "balance"}
    started = [e.data["stage"] for e in events if e.type == "stage.started"]
    assert started == RUN_STAGES  # soft-skipped stages start too (they ran)
    end = finished(events)
    assert end == {"status": "passed", "stage_reached": "evidence", "first_error": None}
    assert events[0].data["spec"]["name"] == "tiny" and events[0].data["resume"] is False
    # stdout carries the same lines as the file, in the same order
    assert done.stdout == (run_dir / "events.jsonl").read_text()
    item_ids = sorted(e.data["id"] for e in events if e.type == "item.done")
    assert item_ids == ["a1", "a2", "a3"]
    env = json.loads((run_dir / "environment.json").read_text())
    assert set(env["stages"]) == set(RUN_STAGES)
    assert env["stages"]["torch"]["facts"]["build"] == "cpu"
    assert env["stages"]["compute"]["facts"]["fp32_tflops"] > 0
    assert env["stages"]["memory"]["facts"]["batch_ids"] == ["a2", "a1"]
    assert env["stages"]["interpreter"]["facts"]["matches"] is True
    assert (run_dir / "spec.json").exists()
    assert not list(run_dir.glob("*.tmp*"))

    # The same directory again: refused, nothing touched; with --resume, numbering goes on.
    before = (run_dir / "events.jsonl").read_bytes()
    again = run_runner(spec, run_dir)
    assert again.returncode == 2
    assert "already has events.jsonl" in again.stderr and "never reused" in again.stderr
    assert (run_dir / "events.jsonl").read_bytes() == before
    resumed = run_runner(spec, run_dir, "--resume")
    assert resumed.returncode == 0, resumed.stderr
    events = events_of(run_dir)  # still 1..n across both processes
    starts = [e for e in events if e.type == "run.started"]
    assert [s.data["resume"] for s in starts] == [False, True]
    assert finished(events)["status"] == "passed"


def test_bad_spec_exits_2_naming_the_field(tmp_path: Path) -> None:
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"run_id": "x", "name": "y"}))
    done = run_runner(spec, tmp_path / "run")
    assert done.returncode == 2
    assert "spec.inputs: missing" in done.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()
    spec.write_text("{not json")
    done = run_runner(spec, tmp_path / "run")
    assert done.returncode == 2 and "is not JSON" in done.stderr
    missing = run_runner(tmp_path / "nope.json", tmp_path / "run")
    assert missing.returncode == 2 and "cannot read spec" in missing.stderr


def test_missing_run_dir_argument_is_a_usage_error(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.runner.test_stages_kit import REPO, runner_env

    done = subprocess.run([sys.executable, "-m", "runner", str(tmp_path / "spec.json")],
                          capture_output=True, text=True, env=runner_env(), cwd=REPO,
                          timeout=60, check=False)
    assert done.returncode == 2 and "--run-dir" in done.stderr
