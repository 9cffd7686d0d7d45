"""The runner-process stages called directly on real specs: interpreter and prepare."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

import pytest

from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure
from runner.stages.interpreter import interpreter, python_constraint
from runner.stages.prepare import prepare

MAJOR_MINOR = ".".join(platform.python_version().split(".")[:2])


def _ctx(tmp_path: Path, **raw: Any) -> StageContext:
    spec = RunSpec.from_dict({"run_id": "r-basic", "name": "basic",
                              "inputs": {"dir": str(tmp_path)}, **raw})
    return StageContext(spec=spec, run_dir=str(tmp_path))


@pytest.mark.parametrize(("wanted", "spec"), [
    ("3.11", "==3.11.*"), ("3.11.*", "==3.11.*"), (" >=3.9 ", ">=3.9"), ("==3.11", "==3.11"),
])
def test_python_constraint(wanted: str, spec: str) -> None:
    assert python_constraint(wanted) == spec


def test_bare_major_minor_means_the_whole_series(tmp_path: Path) -> None:
    facts = interpreter(_ctx(tmp_path, python=MAJOR_MINOR))
    assert facts["matches"] is True


def test_exact_major_minor_fails_with_a_hint_on_pep_440(tmp_path: Path) -> None:
    if platform.python_version().endswith(".0"):
        pytest.fail("this test needs a Python whose micro version is not 0")
    with pytest.raises(StageFailure) as info:
        interpreter(_ctx(tmp_path, python=f"=={MAJOR_MINOR}"))
    assert info.value.error_type == "WrongInterpreter"
    assert f"=={MAJOR_MINOR}.* for any" in str(info.value.hint)


def test_unreadable_python_constraint_is_named(tmp_path: Path) -> None:
    with pytest.raises(StageFailure) as info:
        interpreter(_ctx(tmp_path, python=">=three"))
    assert "python constraint '>=three' cannot be read" in info.value.message


def test_prepare_checks_the_free_disk_the_manifest_asks_for(tmp_path: Path) -> None:
    with pytest.raises(StageFailure) as info:
        prepare(_ctx(tmp_path, diagnostics={"min_free_disk_gib": 10 ** 9}))
    assert "GiB free on the run directory's disk" in info.value.message
    assert info.value.facts["free_disk_gib"] > 0
    assert not (tmp_path / "spec.json").exists()
    facts = prepare(_ctx(tmp_path, diagnostics={"min_free_disk_gib": 0.001}))
    assert facts["spec_copied"] is True and (tmp_path / "spec.json").exists()
    copied = json.loads((tmp_path / "spec.json").read_text())
    assert RunSpec.from_dict(copied).run_id == "r-basic"
