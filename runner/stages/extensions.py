"""The extensions stage: import each listed extension and run one small real operation.

Built-in checks: ``triton`` (compile and run a tiny kernel), ``flash_attn``, ``xformers``
(one attention call compared with torch's), ``bitsandbytes`` (blockwise 8-bit round trip).
Any other plain name is imported (an import-only check, said so in its facts). A
``module:function`` entry, in ``diagnostics.extensions`` or ``diagnostics.checks``, is a user
check: called as ``function()`` (or ``function(device)`` when it takes one argument); it
passes unless it raises or returns ``False``; a returned dict is kept as its facts.
Each extension is reported on its own; the stage fails when any of them failed.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.spec import RunSpec
from runner.stage import StageContext, StageFailure, StageSkipped
from runner.stages.hints import describe_error

TRITON_SOURCE = '''
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) + tl.load(y_ptr + offs, mask=mask),
             mask=mask)
'''


def extensions(ctx: StageContext) -> Dict[str, Any]:
    names = list(ctx.spec.diagnostics.extensions or []) + list(ctx.spec.diagnostics.checks or [])
    if not names:
        raise StageSkipped("none listed")
    _project_on_path(ctx.spec)
    results: Dict[str, Dict[str, Any]] = {}
    first: Optional[Tuple[str, BaseException]] = None
    for name in names:
        t0 = time.perf_counter()
        try:
            facts = check_one(name, ctx)
            results[name] = {"ok": True, **facts}
        except Exception as exc:  # noqa: BLE001 - each extension reports its own failure
            results[name] = {"ok": False, "error": describe_error(exc)}
            first = first or (name, exc)
        results[name]["seconds"] = round(time.perf_counter() - t0, 3)
    facts = {"checked": names, "results": results,
             "failed": [n for n, r in results.items() if not r["ok"]]}
    if first is not None:
        first_name, first_exc = first
        failed = ", ".join(facts["failed"])
        raise StageFailure("extensions", f"extension check failed: {failed}; first: "
                           f"{first_name}: {type(first_exc).__name__}: {first_exc}",
                           facts=facts, error_type=type(first_exc).__name__) from first_exc
    return facts


def _project_on_path(spec: RunSpec) -> None:
    project = spec.project.dir
    if project and os.path.isdir(project):
        path = os.path.abspath(project)
        if path not in sys.path:
            sys.path.insert(0, path)


def check_one(name: str, ctx: StageContext) -> Dict[str, Any]:
    if ":" in name:
        return run_user_check(name, ctx.device)
    builtin = BUILTIN.get(name)
    module = importlib.import_module(name)
    facts: Dict[str, Any] = {"version": getattr(module, "__version__", None),
                             "file": getattr(module, "__file__", None)}
    if builtin is None:
        facts["check"] = "import only"
        return facts
    facts["check"] = builtin(ctx.device)
    return facts


def run_user_check(ref: str, device: str) -> Dict[str, Any]:
    module_name, _, func_name = ref.partition(":")
    func = getattr(importlib.import_module(module_name), func_name, None)
    if func is None or not callable(func):
        raise AttributeError(f"{module_name} has no callable {func_name!r}")
    try:
        takes_arg = len(inspect.signature(func).parameters) >= 1
    except (TypeError, ValueError):
        takes_arg = False
    value = func(device) if takes_arg else func()
    if value is False:
        raise AssertionError(f"user check {ref} returned False")
    return {"check": "user", **(value if isinstance(value, dict) else {})}


def _need_gpu(name: str, device: str) -> None:
    if device == "cpu":
        raise RuntimeError(f"{name} needs a CUDA/ROCm device; this run's device is cpu")


def _check_close(name: str, got: Any, want: Any, tol: float) -> str:
    err = float((got.float() - want.float()).abs().max())
    if not err <= tol:
        raise AssertionError(f"{name} result differs from torch's: max error {err:.3g} > {tol}")
    return f"ok (max error {err:.2g})"


def check_triton(device: str) -> str:
    import torch

    _need_gpu("triton", device)
    folder = tempfile.mkdtemp(prefix="preflight-triton-")
    path = os.path.join(folder, "preflight_triton_probe.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(TRITON_SOURCE)
    spec = importlib.util.spec_from_file_location("preflight_triton_probe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    n = 1000
    x = torch.randn(n, device=device)
    y = torch.randn(n, device=device)
    out = torch.empty_like(x)
    module.add_kernel[((n + 255) // 256,)](x, y, out, n, BLOCK=256)
    torch.cuda.synchronize()
    return "kernel " + _check_close("triton add kernel", out, x + y, 1e-6)


def _attention_inputs(device: str) -> Tuple[Any, Any, Any, Any]:
    import torch

    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 128, 4, 64, device=device, dtype=torch.float16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(
        q.transpose(1, 2).float(), k.transpose(1, 2).float(), v.transpose(1, 2).float()
    ).transpose(1, 2)
    return q, k, v, ref


def check_flash_attn(device: str) -> str:
    _need_gpu("flash_attn", device)
    from flash_attn import flash_attn_func

    q, k, v, ref = _attention_inputs(device)
    return "attention " + _check_close("flash_attn_func", flash_attn_func(q, k, v), ref, 2e-2)


def check_xformers(device: str) -> str:
    _need_gpu("xformers", device)
    import xformers.ops as xops

    q, k, v, ref = _attention_inputs(device)
    out = xops.memory_efficient_attention(q, k, v)
    return "attention " + _check_close("memory_efficient_attention", out, ref, 2e-2)


def check_bitsandbytes(device: str) -> str:
    import torch

    _need_gpu("bitsandbytes", device)
    import bitsandbytes.functional as bnbf

    x = torch.randn(4096, device=device)
    quantized, state = bnbf.quantize_blockwise(x)
    back = bnbf.dequantize_blockwise(quantized, state)
    return "8-bit round trip " + _check_close("quantize_blockwise", back, x, 0.1)


BUILTIN: Dict[str, Callable[[str], str]] = {
    "triton": check_triton,
    "flash_attn": check_flash_attn,
    "xformers": check_xformers,
    "bitsandbytes": check_bitsandbytes,
}

__all__: List[str] = ["extensions", "check_one", "run_user_check", "BUILTIN"]
