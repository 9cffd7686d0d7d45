"""The compute stage: matmuls checked against a CPU reference, then timed against the
catalog's per-card peaks (``hardware.bf16_tflops`` / ``fp32_tflops`` in the spec)."""

from __future__ import annotations

import time
from typing import Any, Dict, List, Tuple

from runner.stage import StageContext, StageFailure

# Max relative error of a device matmul against a float64 CPU product of the same
# (already rounded) inputs: accumulation error only. fp32 allows TF32 on GPUs.
TOLERANCE = {"float32": 2e-3, "bfloat16": 2e-2, "float16": 5e-3}
CPU_CHECK, CPU_TIMED, GPU_CHECK, GPU_TIMED = 96, 256, 1024, 8192


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
    if on_gpu:
        return every_card(ctx, torch, check_n, timed_n, dtypes, facts)
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


def every_card(ctx: StageContext, torch: Any, check_n: int, timed_n: int, dtypes: List[str],
               facts: Dict[str, Any]) -> Dict[str, Any]:
    """Every card at once, one thread each (runner.stages.compute_cards); the workload of
    the later stages then runs on the first healthy card."""
    from runner.stages.compute_cards import judge_compute, measure_all

    count = ctx.facts.get("device", {}).get("count")
    cards = list(range(count if isinstance(count, int) else torch.cuda.device_count()))
    results = measure_all(torch, cards, check_n, timed_n, dtypes, matmul_error, timed_matmul)
    judge_compute(ctx, results, TOLERANCE, facts)
    healthy = facts.get("healthy_cards") or []
    if healthy and healthy[0] != torch.cuda.current_device():
        torch.cuda.set_device(healthy[0])
    facts["pilot_card"] = torch.cuda.current_device()
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
