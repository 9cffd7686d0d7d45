"""The compute stage measures against the catalog's per-card peaks the spec carries."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from runner.spec import RunSpec
from runner.stage import StageContext
from runner.stages.compute import compute

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # this torch build warns that numpy is absent
    import torch  # noqa: F401


def run_compute(tmp_path: Path, hardware: dict) -> dict:
    spec = RunSpec.from_dict({"run_id": "r", "name": "n", "hardware": hardware,
                              "inputs": {"dir": str(tmp_path)}})
    ctx = StageContext(spec=spec, run_dir=str(tmp_path), facts={"device": {"device": "cpu"}})
    return compute(ctx)


def test_a_known_peak_gives_a_fraction_and_an_unknown_one_none(tmp_path: Path) -> None:
    facts = run_compute(tmp_path, {"gpu": "H100", "bf16_tflops": 989, "fp32_tflops": None})
    assert facts["bf16_peak_tflops"] == 989
    assert facts["bf16_tflops"] > 0
    assert facts["bf16_fraction_of_peak"] == pytest.approx(facts["bf16_tflops"] / 989, abs=1e-4)
    assert facts["fp32_peak_tflops"] is None and facts["fp32_fraction_of_peak"] is None


def test_a_cpu_run_says_none_only_without_a_figure(tmp_path: Path) -> None:
    facts = run_compute(tmp_path, {"gpu": "cpu"})
    assert facts["fp32_tflops"] > 0 and facts["bf16_tflops"] > 0
    for key in ("bf16", "fp32"):
        assert facts[f"{key}_peak_tflops"] is None and facts[f"{key}_fraction_of_peak"] is None
    facts = run_compute(tmp_path, {"gpu": "cpu", "bf16_tflops": 1.5, "fp32_tflops": 0.5})
    # the facts are rounded to 4 decimals: the fraction agrees within that rounding
    assert facts["fp32_fraction_of_peak"] == pytest.approx(facts["fp32_tflops"] / 0.5, abs=2e-4)
    assert facts["bf16_fraction_of_peak"] == pytest.approx(facts["bf16_tflops"] / 1.5, abs=2e-4)
    assert facts["fp32_fraction_of_peak"] > 0 and facts["bf16_fraction_of_peak"] > 0
