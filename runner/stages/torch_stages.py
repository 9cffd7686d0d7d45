"""The torch, device and compute stages (run in the watchdog's worker; torch imported here)."""

from __future__ import annotations

import os
import re
import time
from typing import Any, Dict, List, Tuple

from runner.stages import StageContext, StageFailure

GIB = 1024 ** 3
# Max relative error of a device matmul against a float64 CPU product of the same
# (already rounded) inputs: accumulation error only. fp32 allows TF32 on GPUs.
TOLERANCE = {"float32": 2e-3, "bfloat16": 2e-2, "float16": 5e-3}
CPU_CHECK, CPU_TIMED, GPU_CHECK, GPU_TIMED = 96, 256, 1024, 8192
BACKEND_INDEX = {"cuda": "https://download.pytorch.org/whl/cu126",
                 "rocm": "https://download.pytorch.org/whl/rocm6.3"}


def torch_stage(ctx: StageContext) -> Dict[str, Any]:
    """torch imports, and its build (CUDA, HIP or CPU-only) matches the manifest's backend."""
    t0 = time.perf_counter()
    try:
        import torch
    except Exception as exc:  # ImportError, OSError from a missing libcudart, ...
        raise StageFailure("torch", f"cannot import torch: {type(exc).__name__}: {exc}",
                           facts={"import_seconds": round(time.perf_counter() - t0, 3)},
                           hint=None) from exc
    cuda = getattr(torch.version, "cuda", None)
    hip = getattr(torch.version, "hip", None)
    build = "rocm" if hip else "cuda" if cuda else "cpu"
    facts: Dict[str, Any] = {
        "version": torch.__version__, "cuda": cuda, "hip": hip, "build": build,
        "file": getattr(torch, "__file__", None),
        "import_seconds": round(time.perf_counter() - t0, 3),
        "num_threads": torch.get_num_threads(),
    }
    try:
        facts["cudnn"] = torch.backends.cudnn.version() if cuda else None  # type: ignore[no-untyped-call]
    except Exception:  # noqa: BLE001 - cudnn probing is informational
        facts["cudnn"] = None
    backend = ctx.spec.backend
    if backend in ("cuda", "rocm") and build != backend:
        raise StageFailure(
            "torch", f"torch {torch.__version__} is a {_build_words(build)} build but the "
            f"manifest asks for backend {backend}", facts=facts, error_type="WrongTorchBuild",
            hint=f"install the {backend} build of torch for this node (e.g. pip install torch "
                 f"--index-url {BACKEND_INDEX[backend]}); an install command copied from "
                 f"another machine is not a compatibility check")
    return facts


def _build_words(build: str) -> str:
    return {"cpu": "CPU-only", "cuda": "CUDA", "rocm": "ROCm/HIP"}[build]


def device(ctx: StageContext) -> Dict[str, Any]:
    """The devices torch sees; enough of them for a lot; the model the manifest named."""
    import torch

    backend = ctx.spec.backend
    if backend not in ("cuda", "rocm"):
        return {"device": "cpu", "count": 1, **cpu_facts(), "threads": torch.get_num_threads()}
    from runner.stages.smi import driver_facts

    driver = driver_facts(backend)
    if not torch.cuda.is_available():
        raise StageFailure("device", f"torch sees no GPU (torch.cuda.is_available() is False, "
                           f"backend {backend})", facts={"driver": driver}, error_type="NoDevice",
                           hint="check that the node has a GPU and its driver loaded "
                                "(nvidia-smi / rocm-smi) and CUDA_VISIBLE_DEVICES")
    devices = [gpu_facts(torch, i) for i in range(torch.cuda.device_count())]
    facts: Dict[str, Any] = {"device": "cuda", "count": len(devices), "devices": devices,
                             "driver": driver, "arch_list": torch.cuda.get_arch_list(),
                             "warnings": []}
    hw = ctx.spec.hardware
    wanted = int(hw.cards_per_lot or 1)
    if len(devices) < wanted:
        raise StageFailure("device", f"torch sees {len(devices)} GPU(s), a lot of {hw.gpu} "
                           f"has {wanted}", facts=facts, error_type="TooFewDevices",
                           hint="check CUDA_VISIBLE_DEVICES and that the rented lot is the one "
                                "ordered")
    facts["warnings"] = device_warnings(hw.gpu, devices, facts["arch_list"])
    return facts


def gpu_facts(torch: Any, index: int) -> Dict[str, Any]:
    props = torch.cuda.get_device_properties(index)
    row: Dict[str, Any] = {"index": index, "name": props.name,
                           "memory_gib": round(props.total_memory / GIB, 2),
                           "multiprocessors": getattr(props, "multi_processor_count", None)}
    arch = getattr(props, "gcnArchName", None)
    if arch:
        row["gfx_arch"] = arch
    else:
        row["capability"] = f"{props.major}.{props.minor}"
    return row


def device_warnings(model: str, devices: List[Dict[str, Any]], arch_list: List[str]) -> List[str]:
    """Model mismatch and an architecture missing from this torch build (warnings only)."""
    warnings = []
    want = re.sub(r"[^a-z0-9]", "", (model or "").lower())
    for dev in devices:
        name = re.sub(r"[^a-z0-9]", "", str(dev["name"]).lower())
        if want and want not in ("cpu", "any") and want not in name:
            warnings.append(f"GPU {dev['index']} is {dev['name']}, the manifest asks for {model}")
        cap = dev.get("capability")
        arch = f"sm_{cap.replace('.', '')}" if cap else str(dev.get("gfx_arch", "")).split(":")[0]
        if arch and arch_list and arch not in arch_list:
            warnings.append(f"GPU {dev['index']} arch {arch} is not in this torch build's arch "
                            f"list {arch_list}: expect 'no kernel image' errors")
    return warnings


def cpu_facts() -> Dict[str, Any]:
    facts: Dict[str, Any] = {"cpu_count": os.cpu_count()}
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    facts["cpu_model"] = line.split(":", 1)[1].strip()
                    break
        with open("/proc/meminfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("MemTotal:"):
                    facts["memory_gib"] = round(int(line.split()[1]) * 1024 / GIB, 2)
    except OSError:
        pass
    return facts


def compute(ctx: StageContext) -> Dict[str, Any]:
    """A matmul checked against a CPU reference, then timed bf16/fp32 matmuls."""
    import torch

    dev = ctx.device
    on_gpu = dev != "cpu"
    size = int(ctx.spec.diagnostics.compute_size or GPU_CHECK)
    check_n = min(size, GPU_CHECK) if on_gpu else CPU_CHECK
    timed_n = max(size, GPU_TIMED) if on_gpu else CPU_TIMED
    dtypes = ["float32", "bfloat16"] + (["float16"] if on_gpu else [])
    facts: Dict[str, Any] = {"device": dev, "check_size": check_n, "timed_size": timed_n,
                             "check": {}}
    torch.manual_seed(0)
    for name in dtypes:
        err = matmul_error(torch, dev, getattr(torch, name), check_n)
        facts["check"][name] = {"max_rel_error": err, "tolerance": TOLERANCE[name]}
        if not err <= TOLERANCE[name]:  # also catches NaN
            raise StageFailure(
                "compute", f"{name} matmul on {dev} differs from the CPU reference: max "
                f"relative error {err:.3g} > {TOLERANCE[name]:g}", facts=facts,
                error_type="WrongResult",
                hint="the device computes wrong results: check driver and card health "
                     "(nvidia-smi -q -d ECC / rocm-smi), and do not run the job on this node")
    hw = ctx.spec.hardware
    for name, peak in (("bfloat16", hw.bf16_tflops), ("float32", hw.fp32_tflops)):
        tflops, iters = timed_matmul(torch, dev, getattr(torch, name), timed_n, on_gpu)
        key = {"bfloat16": "bf16", "float32": "fp32"}[name]
        facts[f"{key}_tflops"] = round(tflops, 4)
        facts[f"{key}_iterations"] = iters
        facts[f"{key}_peak_tflops"] = peak
        facts[f"{key}_fraction_of_peak"] = round(tflops / peak, 4) if peak else None
    return facts


def matmul_error(torch: Any, dev: str, dtype: Any, n: int) -> float:
    a = torch.randn(n, n, dtype=torch.float64).to(dtype)
    b = torch.randn(n, n, dtype=torch.float64).to(dtype)
    ref = a.double() @ b.double()
    got = (a.to(dev) @ b.to(dev)).double().cpu()
    scale = float(ref.abs().max()) or 1.0
    return float((got - ref).abs().max()) / scale


def timed_matmul(torch: Any, dev: str, dtype: Any, n: int, on_gpu: bool) -> Tuple[float, int]:
    """Achieved TFLOP/s of an n×n matmul, timed for about 0.25 s (GPU) or 0.05 s (CPU)."""
    a = torch.randn(n, n, device=dev).to(dtype)
    b = torch.randn(n, n, device=dev).to(dtype)
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    for _ in range(3):
        a @ b
    sync()
    budget = 0.25 if on_gpu else 0.05
    iters, t0 = 0, time.perf_counter()
    while True:
        for _ in range(10 if on_gpu else 1):
            a @ b
            iters += 1
        sync()
        elapsed = time.perf_counter() - t0
        if elapsed >= budget or (not on_gpu and iters >= 50):
            break
    return 2.0 * n ** 3 * iters / elapsed / 1e12, iters
