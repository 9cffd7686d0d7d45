"""Review findings on the runner: wrong field types in a spec, unrecordable task outputs."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from runner.ledger import Ledger
from runner.spec import RunSpec, SpecError
from runner.stage import StageContext, StageFailure
from runner.stages import balance as balance_stage
from runner.stages import pilot as pilot_stage
from tests.runner.test_stages_kit import events_of, finished, run_runner, write_spec


def _spec(**over: Any) -> dict[str, Any]:
    raw: dict[str, Any] = {"run_id": "r", "name": "n", "inputs": {"dir": "/tmp"}}
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(raw.get(key), dict):
            raw[key] = {**raw[key], **value}
        else:
            raw[key] = value
    return raw


@pytest.mark.parametrize("over,field", [
    ({"inputs": {"dir": 5}}, "spec.inputs.dir"),
    ({"inputs": {"expected_count": "3"}}, "spec.inputs.expected_count"),
    ({"inputs": {"expected_refusals": "a1"}}, "spec.inputs.expected_refusals"),
    ({"task": {"batch_size": "two"}}, "spec.task.batch_size"),
    ({"task": {"batch_size": True}}, "spec.task.batch_size"),
    ({"task": {"categories": "short"}}, "spec.task.categories"),
    ({"task": {"command": ["python", 3]}}, "spec.task.command"),
    ({"diagnostics": {"timeouts": [1]}}, "spec.diagnostics.timeouts"),
    ({"diagnostics": {"timeouts": {"pilot": "long"}}}, "spec.diagnostics.timeouts"),
    ({"success": {"balance_ok": "yes"}}, "spec.success.balance_ok"),
    ({"results": {"sample_chars": None}}, "spec.results.sample_chars"),
    ({"backend": 7}, "spec.backend"),
    ({"python": 3.9}, "spec.python"),
])
def test_a_field_of_the_wrong_type_is_a_spec_error_naming_it(over: dict[str, Any],
                                                             field: str) -> None:
    with pytest.raises(SpecError) as err:
        RunSpec.from_dict(_spec(**over))
    assert field in str(err.value)


def test_right_types_still_load_ints_as_floats_and_nulls_where_optional() -> None:
    spec = RunSpec.from_dict(_spec(
        hardware={"memory_gib": 80, "bf16_tflops": None},
        diagnostics={"timeouts": {"pilot": 30}, "min_free_disk_gib": 1},
        task={"command": ["python", "run.py"], "handler": None}))
    assert spec.hardware.memory_gib == 80 and spec.diagnostics.timeouts == {"pilot": 30}
    assert spec.to_dict() == RunSpec.from_dict(spec.to_dict()).to_dict()


def test_the_runner_exits_2_on_a_wrongly_typed_field_not_a_traceback(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, diagnostics={"timeouts": [1]})
    done = run_runner(spec, tmp_path / "run")
    assert done.returncode == 2
    assert "spec.diagnostics.timeouts" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "run" / "events.jsonl").exists()


HANDLERS = '''
def setout(items, ctx):
    return [{"id": i.id, "status": "accepted", "category": "x",
             "output": {"tags": {1, 2}} if i.id == "i2" else {"n": i.size}} for i in items]
'''


def test_an_output_that_is_not_json_loses_only_its_item_and_is_named(tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    for k in (1, 2, 3):
        (tmp_path / "in" / f"i{k}.txt").write_text("x" * k)
    (tmp_path / "hmod_review.py").write_text(textwrap.dedent(HANDLERS))
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    spec = RunSpec.from_dict({
        "run_id": "r", "name": "n", "project": {"dir": str(tmp_path)},
        "inputs": {"dir": str(tmp_path / "in"), "expected_count": 3},
        "task": {"handler": "hmod_review:setout", "categories": ["x"], "batch_size": 3}})
    emitted: list[tuple[str, dict[str, Any]]] = []
    ctx = StageContext(spec=spec, run_dir=str(run_dir),
                       emit=lambda t, **d: emitted.append((t, d)))
    try:
        facts = pilot_stage.pilot(ctx)
    finally:
        sys.modules.pop("hmod_review", None)
    assert facts["recorded"] == 2
    assert sorted(d["id"] for t, d in emitted if t == "item.done") == ["i1", "i3"]
    with Ledger.open(str(run_dir / "ledger.sqlite")) as ledger:
        anomalies = ledger.anomalies()
    assert [(a.kind, a.id) for a in anomalies] == [("bad_output", "i2")]
    assert "not JSON" in anomalies[0].detail
    with pytest.raises(StageFailure) as err:
        balance_stage.balance(ctx)
    assert "bad_output i2" in str(err.value) and "missing i2" in str(err.value)
    assert json.loads((run_dir / "outputs" / "i1.json").read_text()) == {"n": 1}


def test_a_file_name_that_is_not_utf8_is_an_inputs_error_naming_it(tmp_path: Path) -> None:
    from runner.inputs import InputsError, list_dir

    (tmp_path / "ok.txt").write_text("fine")
    with open(os.path.join(os.fsencode(tmp_path), b"caf\xe9.txt"), "w") as fh:
        fh.write("latin-1 name")
    with pytest.raises(InputsError) as err:
        list_dir(str(tmp_path), "*.txt")
    assert "not valid UTF-8" in str(err.value) and "caf" in str(err.value)


def test_an_event_with_a_lone_surrogate_is_still_written_as_valid_json(tmp_path: Path) -> None:
    from runner.events import EventWriter, read_events

    writer = EventWriter(str(tmp_path / "events.jsonl"), "r")
    writer.emit("stage.passed", stage="prepare", facts={"path": "/in/caf\udce9.txt", "é": 1})
    writer.emit("run.finished", status="passed")
    writer.close()
    events, _ = read_events(str(tmp_path / "events.jsonl"))
    assert [e.seq for e in events] == [1, 2]
    assert events[0].data["facts"] == {"path": "/in/caf\udce9.txt", "é": 1}


def test_the_runner_reports_a_non_utf8_input_name_instead_of_dying(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    inputs = os.fsencode(tmp_path / "project" / "inputs")
    with open(os.path.join(inputs, b"caf\xe9.txt"), "w") as fh:
        fh.write("latin-1 name")
    done = run_runner(spec, tmp_path / "run")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr
    events = events_of(tmp_path / "run")
    end = finished(events)
    assert end["status"] == "failed" and "not valid UTF-8" in end["first_error"]["message"]


def test_resume_over_a_corrupt_middle_line_names_that_line(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "events.jsonl").write_text(
        '{"seq":1,"type":"run.started","run":"r-test","ts":"t"}\ngarbage\n'
        '{"seq":3,"type":"x","run":"r-test","ts":"t"}\n')
    done = run_runner(spec, run_dir, "--resume")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "line 2: not JSON" in done.stderr
