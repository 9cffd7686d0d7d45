"""The device stage: the cards torch sees, enough of them for a lot, the model named."""

from __future__ import annotations

import os
import re
from typing import Any, Dict, List

from runner.stage import StageContext, StageFailure

GIB = 1024 ** 3


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
    from runner.stages.cardset import gpu_cards, torch_card

    devices = [torch_card(torch, i) for i in range(torch.cuda.device_count())]
    facts: Dict[str, Any] = {"device": "cuda", "count": len(devices), "devices": devices,
                             "driver": driver, "arch_list": torch.cuda.get_arch_list(),
                             "warnings": []}
    facts["warnings"] = device_warnings(ctx.spec.hardware.gpu, devices, facts["arch_list"])
    gpu_cards(ctx, devices, facts)  # health, count against the rent, healthy cards
    return facts


def device_warnings(model: str, devices: List[Dict[str, Any]], arch_list: List[str]) -> List[str]:
    """Model mismatch and an architecture missing from this torch build (warnings only)."""
    warnings = []
    want = re.sub(r"[^a-z0-9]", "", (model or "").lower())
    for dev in devices:
        name = re.sub(r"[^a-z0-9]", "", str(dev["name"]).lower())
        if want and want not in ("cpu", "any") and want not in name:
            warnings.append(f"GPU {dev['index']} is {dev['name']}, the manifest asks for {model}")
        cap = dev.get("capability")
        if cap and arch_list and not cuda_arch_built(str(cap), arch_list):
            warnings.append(f"GPU {dev['index']} arch sm_{str(cap).replace('.', '')} is not in "
                            f"this torch build's arch list {arch_list} (no kernel for it, nor "
                            "one of its major version it can run, nor PTX to compile): expect "
                            "'no kernel image' errors")
        gfx = str(dev.get("gfx_arch") or "").split(":")[0]
        if not cap and gfx and arch_list and gfx not in arch_list:
            warnings.append(f"GPU {dev['index']} arch {gfx} is not in this torch build's arch "
                            f"list {arch_list}: expect 'no kernel image' errors")
    return warnings


def cuda_arch_built(capability: str, arch_list: List[str]) -> bool:
    """Whether a torch build whose ``get_arch_list()`` is ``arch_list`` has code a card of
    compute ``capability`` ("9.0") runs: its own ``sm_90``, an ``sm_9x`` below it of the
    same major version (binary compatible), or PTX (``compute_XY``) at most its version,
    which the driver compiles. An arch-specific build (``sm_90a``) runs on that card only."""
    try:
        major, minor = (int(p) for p in capability.split(".")[:2])
    except ValueError:
        return True  # not a capability we can read: nothing to say
    want = major * 10 + minor
    for entry in arch_list:
        m = re.fullmatch(r"(sm|compute)_(\d+)([a-z]?)", entry)
        if m is None:
            continue
        have, specific = int(m.group(2)), bool(m.group(3))
        if m.group(1) == "sm" and (have == want or (
                not specific and have // 10 == major and have < want)):
            return True
        if m.group(1) == "compute" and not specific and have <= want:
            return True
    return False


def cpu_facts() -> Dict[str, Any]:
    """The machine without a GPU: its cores and its system RAM, named ``ram_gib`` so that
    nobody reads it as a card's memory."""
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
                    facts["ram_gib"] = round(int(line.split()[1]) * 1024 / GIB, 2)
    except OSError:
        pass
    return facts
