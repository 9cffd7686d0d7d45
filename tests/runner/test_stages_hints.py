"""Hints for the known first errors, the relevant traceback line, the stage table."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runner.events import STAGES
from runner.stage import STAGE_TABLE, StageDef, StageFailure, stage_timeout
from runner.stages.cardset import torch_card
from runner.stages.device import cuda_arch_built, device_warnings
from runner.stages.hints import describe_error, hint_for
from runner.stages.smi import parse_cuda_version, parse_nvidia_smi, parse_rocm_smi


@pytest.mark.parametrize(("etype", "message", "needle"), [
    ("RuntimeError", "CUDA error: no kernel image is available for execution on the device",
     "arch"),
    ("RuntimeError", "The NVIDIA driver on your system is too old (found version 11040)",
     "driver"),
    ("RuntimeError", "CUDA driver version is insufficient for CUDA runtime version", "driver"),
    ("OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", "batch_size"),
    ("RuntimeError", "HIP error: invalid device function", "ROCm"),
    ("OSError", "libcudart.so.12: cannot open shared object file: No such file", "shared"),
    ("ModuleNotFoundError", "No module named 'flash_attn'", "install the missing module"),
    ("AssertionError", "Torch not compiled with CUDA enabled", "CUDA build"),
])
def test_known_first_errors_get_hints(etype: str, message: str, needle: str) -> None:
    hint = hint_for(etype, message)
    assert hint is not None and needle in hint


def test_unknown_errors_get_no_hint() -> None:
    assert hint_for("ValueError", "the answer is not 42") is None


def test_where_is_the_deepest_user_frame(tmp_path: Path) -> None:
    user = tmp_path / "usercode.py"
    user.write_text("import json\n\ndef parse():\n    return json.loads('{bad')\n")
    spec = importlib.util.spec_from_file_location("usercode", user)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    try:
        module.parse()
    except ValueError as exc:
        error = describe_error(exc)
    assert error["type"] == "JSONDecodeError"
    assert error["where"] == f"{user}:4 in parse"  # not json/decoder.py, deeper but stdlib


def test_stage_failure_takes_type_and_where_from_its_cause(tmp_path: Path) -> None:
    try:
        try:
            import definitely_not_a_module_xyz  # noqa: F401
        except ImportError as inner:
            raise StageFailure("torch", f"cannot import: {inner}") from inner
    except StageFailure as exc:
        error = describe_error(exc)
    assert error["type"] == "ModuleNotFoundError"
    assert error["message"].startswith("cannot import")
    assert "install the missing module" in error["hint"]
    assert error["where"] and "test_stages_hints.py" in error["where"]


def test_stage_table_follows_the_contract_order_and_dependencies() -> None:
    names = [s.name for s in STAGE_TABLE]
    assert tuple(names) == STAGES
    for index, stage in enumerate(STAGE_TABLE):
        assert all(names.index(dep) < index for dep in stage.deps), stage.name
    deps = {s.name: set(s.deps) for s in STAGE_TABLE}
    assert deps["pilot"] == {"environment", "compute", "extensions", "memory"}
    assert deps["extensions"] == {"device"} and deps["memory"] == {"compute"}
    assert deps["interconnect"] == {"compute"}  # a slow link does not stop the pilot


def test_timeouts_come_from_the_spec_or_the_defaults() -> None:
    class Diag:
        timeouts = {"torch": 5, "device": "soon", "compute": -1}

    class Spec:
        diagnostics = Diag()

    torch_def = StageDef("torch", "x:y", timeout_s=120)
    assert stage_timeout(torch_def, Spec()) == 5.0
    assert stage_timeout(StageDef("device", "x:y", timeout_s=60), Spec()) == 60.0
    assert stage_timeout(StageDef("compute", "x:y", timeout_s=120), Spec()) == 120.0


def test_vendor_tool_parsing() -> None:
    rows = parse_nvidia_smi("NVIDIA H200, 550.54.15, 143771, GPU-abc, 00000000:19:00.0\n"
                            "NVIDIA H200, 550.54.15, [N/A], GPU-def, 00000000:3B:00.0\n")
    assert rows[0] == {"name": "NVIDIA H200", "driver_version": "550.54.15",
                       "memory_mib": 143771, "uuid": "GPU-abc",
                       "pci_bus_id": "00000000:19:00.0"}
    assert rows[1]["memory_mib"] is None
    assert parse_cuda_version("| NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  "
                              "CUDA Version: 12.4     |") == "12.4"
    rocm = parse_rocm_smi('{"card0": {"Card series": "AMD Instinct MI300X", "GFX Version": '
                          '"gfx942"}, "system": {"Driver version": "6.8.5"}}')
    assert rocm == {"cards": [{"card": "card0", "name": "AMD Instinct MI300X",
                               "gfx": "gfx942"}], "driver_version": "6.8.5"}
    assert parse_rocm_smi("not json") == {}


def test_device_warnings_for_model_and_arch() -> None:
    devices = [{"index": 0, "name": "NVIDIA H100 80GB HBM3", "capability": "9.0"}]
    assert device_warnings("H100", devices, ["sm_80", "sm_90"]) == []
    warns = device_warnings("H200", devices, ["sm_80"])
    assert any("manifest asks for H200" in w for w in warns)
    assert any("sm_90" in w and "no kernel image" in w for w in warns)
    amd = [{"index": 0, "name": "AMD Instinct MI300X", "gfx_arch": "gfx942:sramecc+:xnack-"}]
    assert device_warnings("MI300X", amd, ["gfx942"]) == []
    assert any("gfx942" in w for w in device_warnings("MI300X", amd, ["gfx90a"]))


# torch 2.11+cu130's get_arch_list() on a rented H200 (2026-12-04)
H200_TORCH_ARCHS = ["sm_75", "sm_80", "sm_86", "sm_90", "sm_100", "sm_120"]


def test_a_cuda_card_is_judged_by_its_capability_and_what_runs_on_it() -> None:
    """Seen on a real H200: the card's row from torch carried gcnArchName (its name) and the
    stage warned "arch NVIDIA H200 is not in this torch build's arch list". A CUDA card is
    judged by its compute capability: its own sm, a lower sm of its major version, or PTX."""
    h200 = [{"index": 0, "name": "NVIDIA H200", "capability": "9.0"}]
    assert device_warnings("H200", h200, H200_TORCH_ARCHS) == []
    l40s = [{"index": 0, "name": "NVIDIA L40S", "capability": "8.9"}]
    assert device_warnings("L40S", l40s, ["sm_80", "sm_86"]) == []  # sm_86 runs on 8.9
    assert device_warnings("L40S", l40s, ["sm_80", "compute_80"]) == []  # PTX, compiled
    [warn] = device_warnings("L40S", l40s, ["sm_75", "sm_90a"])
    assert "arch sm_89 is not in this torch build's arch list" in warn
    assert device_warnings("B200", [{"index": 0, "name": "NVIDIA B200", "capability": "10.0"}],
                           ["sm_90"]) != []  # another major version: nothing runs
    assert cuda_arch_built("9.0", ["sm_90a"]) and not cuda_arch_built("9.0", ["sm_86"])


class _Props:
    name, total_memory, multi_processor_count = "NVIDIA H200", 150_117_562_368, 132
    major, minor, gcnArchName = 9, 0, "NVIDIA H200"  # as torch 2.11+cu130 has it


def _torch(hip: str | None) -> Any:
    return SimpleNamespace(version=SimpleNamespace(hip=hip, cuda=None if hip else "13.0"),
                           cuda=SimpleNamespace(get_device_properties=lambda i: _Props()))


def test_a_cuda_build_s_card_row_has_its_capability_not_a_gfx_arch() -> None:
    row = torch_card(_torch(None), 0)
    assert row["capability"] == "9.0" and "gfx_arch" not in row
    rocm = torch_card(_torch("6.4"), 0)
    assert rocm["gfx_arch"] == "NVIDIA H200" and "capability" not in rocm



def test_where_is_never_a_frame_of_the_runner_itself(tmp_path: Path) -> None:
    from runner.spec import RunSpec
    from runner.stage import StageContext
    from runner.watchdog import run_stage_here

    spec = RunSpec.from_dict({"run_id": "r", "name": "n", "project": {"dir": str(tmp_path)},
                              "inputs": {"dir": str(tmp_path / "missing"), "pattern": "*"},
                              "task": {"handler": "x:y"}})
    result = run_stage_here("pilot", StageContext(spec=spec, run_dir=str(tmp_path)))
    assert result["status"] == "failed" and "missing" in result["error"]["message"]
    # Every frame is Preflight's own (the stage, runner/inputs.py): no "where" to offer.
    assert result["error"]["where"] is None
