"""The torch stage: torch imports and its build matches the manifest's backend.

Runs in the watchdog's worker; torch is imported inside the function (an absolute
``import torch`` here is the installed torch, never this module).
"""

from __future__ import annotations

import time
from typing import Any, Dict

from runner.stage import StageContext, StageFailure

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
