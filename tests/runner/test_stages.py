"""Each failure mode of the diagnostic ladder, produced for real by ``python -m runner``.

Every test asserts the failed stage, the first error's text, and the skipped stages with
their reasons; events.jsonl is checked well-formed (seq 1..n) by ``events_of``.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.processes import alive
from tests.runner.test_stages_kit import (
    failed_run,
    finished,
    outcomes,
    runner_env,
    status_of,
    write_spec,
)

AFTER_TORCH = ["device", "compute", "interconnect", "extensions", "memory", "pilot", "balance"]


def skipped_reasons(events: list) -> dict[str, str]:
    return {name: e.data["reason"] for name, e in outcomes(events).items()
            if e.type == "stage.skipped"}


def test_torch_not_importable(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "torch"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text('raise ImportError("shadowed: no torch on this node")\n')
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir, env=runner_env(tmp_path / "shadow"))
    status = status_of(events)
    assert status["torch"] == "failed"
    assert status["environment"] == "passed"  # independent of torch: still reported
    error = outcomes(events)["torch"].data["error"]
    assert error["type"] == "ImportError"
    assert "cannot import torch" in error["message"] and "shadowed" in error["message"]
    assert error["where"] and "torch/__init__.py:1" in error["where"]
    reasons = skipped_reasons(events)
    assert {name: reasons.get(name) for name in AFTER_TORCH} == \
        {name: "torch failed" for name in AFTER_TORCH}
    end = finished(events)
    assert end["status"] == "failed" and end["stage_reached"] == "torch"
    assert end["first_error"]["stage"] == "torch"
    assert "shadowed" in end["first_error"]["message"]


def test_requirements_missing_and_wrong_version(tmp_path: Path) -> None:
    project = tmp_path / "project"
    project.mkdir()
    (project / "requirements-rebuild.txt").write_text(
        "# rebuild list\nPyYAML>=5.1\ndefinitely-not-installed-xyz>=1.0\n"
        "pytest<1.0  # far too old\nanother_missing_pkg\n")
    spec = write_spec(tmp_path, project={"requirements": "requirements-rebuild.txt"})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir)
    status = status_of(events)
    assert status["environment"] == "failed"
    for stage in ("torch", "device", "compute", "memory"):
        assert status[stage] == "passed", stage
    link = outcomes(events)["interconnect"]  # a CPU node has one "card"
    assert link.data["reason"] == "one card" and link.data["blocking"] is False
    event = outcomes(events)["environment"]
    message = event.data["error"]["message"]
    assert "definitely-not-installed-xyz" in message and "another_missing_pkg" in message
    assert "pytest" in message and "wants <1.0" in message
    facts = event.data["facts"]
    assert [m["name"] for m in facts["missing"]] == ["definitely-not-installed-xyz",
                                                     "another_missing_pkg"]
    assert [m["name"] for m in facts["mismatched"]] == ["pytest"]
    assert facts["satisfied"] == 1 and facts["checked"] == 4
    assert facts["missing"][0]["where"].endswith("requirements-rebuild.txt:3")
    assert event.data["error"]["hint"] and "pip install -r" in event.data["error"]["hint"]
    reasons = skipped_reasons(events)
    assert reasons["pilot"] == "environment failed"
    assert reasons["balance"] == "environment failed"
    assert reasons["evidence"] == "no copy_to in the manifest"  # runs after a failure too
    assert finished(events)["first_error"]["stage"] == "environment"


def test_cuda_backend_on_cpu_only_torch(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, backend="cuda", hardware={"gpu": "H200", "vendor": "nvidia"})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir)
    event = outcomes(events)["torch"]
    assert event.type == "stage.failed"
    assert event.data["error"]["type"] == "WrongTorchBuild"
    assert "CPU-only build" in event.data["error"]["message"]
    assert "backend cuda" in event.data["error"]["message"]
    assert "download.pytorch.org" in event.data["error"]["hint"]
    assert event.data["facts"]["build"] == "cpu"
    reasons = skipped_reasons(events)
    assert all(reasons[name] == "torch failed" for name in AFTER_TORCH)


def test_user_extension_check_that_raises(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, diagnostics={"checks": ["tinycheck:fine", "tinycheck:boom"]})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir)
    status = status_of(events)
    assert status["extensions"] == "failed" and status["memory"] == "passed"
    event = outcomes(events)["extensions"]
    error = event.data["error"]
    assert error["type"] == "RuntimeError"
    assert "tinycheck:boom" in error["message"] and "cannot open shared object" in error["message"]
    # the deepest frame in the user's code, not the runner's
    assert "tinycheck.py" in error["where"] and error["where"].endswith("in helper")
    assert "shared library" in error["hint"]
    results = event.data["facts"]["results"]
    assert results["tinycheck:fine"]["ok"] is True and results["tinycheck:fine"]["answer"] == 42
    assert results["tinycheck:boom"]["ok"] is False
    reasons = skipped_reasons(events)
    assert reasons["pilot"] == "extensions failed"
    assert reasons["evidence"] == "no copy_to in the manifest"


def test_stage_that_hangs_past_its_timeout(tmp_path: Path) -> None:
    pidfile = tmp_path / "hang.pids"
    spec = write_spec(tmp_path, diagnostics={"checks": ["tinycheck:hang"],
                                             "timeouts": {"extensions": 2}})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir, env=runner_env(TINYCHECK_PIDFILE=str(pidfile)),
                        timeout=90)
    status = status_of(events)
    error = outcomes(events)["extensions"].data["error"]
    assert status["extensions"] == "failed"
    assert error["type"] == "Timeout" and "timed out after 2 s" in error["message"]
    assert "diagnostics.timeouts.extensions" in error["hint"]
    # memory does not depend on extensions: a fresh worker ran it
    assert status["memory"] == "passed"
    assert skipped_reasons(events)["pilot"] == "extensions failed"
    # the hung check and the process it started were killed with the worker's group
    worker_pid, child_pid = (int(p) for p in pidfile.read_text().split())
    for pid in (worker_pid, child_pid):
        assert not alive(pid), pid


def test_workload_exhausts_memory_budget(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, task={"params": {"hog_mib": 200}},
                      diagnostics={"memory_budget_gib": 0.05})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir)
    event = outcomes(events)["memory"]
    assert event.type == "stage.failed"
    assert event.data["error"]["type"] == "MemoryBudgetExceeded"
    assert "over the memory budget of 0.05 GiB" in event.data["error"]["message"]
    facts = event.data["facts"]
    assert facts["workload_peak_gib"] > 0.15 and facts["budget_gib"] == 0.05
    assert facts["batch_ids"] == ["a2", "a1"]
    reasons = skipped_reasons(events)
    assert reasons["pilot"] == "memory failed" and reasons["balance"] == "memory failed"
    env = json.loads((run_dir / "environment.json").read_text())
    assert env["first_error"]["stage"] == "memory"
    assert env["stages"]["pilot"]["status"] == "skipped"


def test_workload_that_crashes_on_its_largest_batch(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, task={"handler": "tinycheck:crash"})
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir)
    error = outcomes(events)["memory"].data["error"]
    assert error["type"] == "RuntimeError"
    assert "largest batch (a2, a1)" in error["message"] and "crash: libfoo" in error["message"]
    assert "tinycheck.py" in error["where"] and error["where"].endswith("in helper")
    assert skipped_reasons(events)["pilot"] == "memory failed"


def test_wrong_interpreter_version(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, python=">=4.0")
    run_dir = tmp_path / "run"
    events = failed_run(spec, run_dir)
    error = outcomes(events)["interpreter"].data["error"]
    assert error["type"] == "WrongInterpreter" and "'>=4.0'" in error["message"]
    reasons = skipped_reasons(events)
    assert reasons["environment"] == "interpreter failed"
    assert reasons["torch"] == "interpreter failed"
    assert reasons["evidence"] == "no copy_to in the manifest"
    assert finished(events)["stage_reached"] == "interpreter"
