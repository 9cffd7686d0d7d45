"""Torch's intra-op threads for the pilot: the cores the worker owns, not the machine's.

Torch starts as many intra-op threads as the machine has physical cores, whatever share of
them this process may use (an affinity mask, a container's CPU quota): on small operations
the extra threads only contend (the example classifier ran twice as fast with one thread
than with torch's default on a 2-core share). The runner sets the threads to the cores the
worker owns: the CPUs of its affinity mask, capped by the cgroup v2 CPU quota, divided by
the workers sharing them (one for the pilot). ``task.torch_threads`` overrides it. What was
chosen, and why, goes into the pilot's facts. Standard library only at import time.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Dict, Optional, Tuple

CPU_MAX = "/sys/fs/cgroup/cpu.max"


def owned_cores(workers: int = 1, cpu_max: str = CPU_MAX) -> Tuple[int, str]:
    """The cores one of ``workers`` workers owns, and how that was found."""
    try:
        affinity = len(os.sched_getaffinity(0))
        how = f"{affinity} CPU(s) in the affinity mask"
    except (AttributeError, OSError):
        affinity = os.cpu_count() or 1
        how = f"{affinity} CPU(s)"
    cores = affinity
    quota = _cgroup_quota(cpu_max)
    if quota is not None and quota < cores:
        cores = quota
        how += f", capped by the cgroup CPU quota ({quota})"
    share = max(1, cores // max(1, workers))
    if workers > 1:
        how += f", shared by {workers} workers"
    return share, how


def _cgroup_quota(path: str) -> Optional[int]:
    try:
        with open(path, encoding="ascii") as fh:
            quota, period = fh.read().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    try:
        return max(1, math.ceil(int(quota) / int(period)))
    except (ValueError, ZeroDivisionError):
        return None


def set_torch_threads(requested: Optional[int], workers: int = 1) -> Dict[str, Any]:
    """Set torch's intra-op threads (when torch is there) and say what was chosen."""
    if requested:
        threads, why = int(requested), "task.torch_threads"
    else:
        threads, why = owned_cores(workers)
        why = f"the cores the worker owns: {why}"
    torch: Any = sys.modules.get("torch")
    if torch is None:
        try:
            import torch  # noqa: F811 - the torch stage has usually imported it already
        except ImportError:
            return {"torch_threads": None, "torch_threads_why": "torch is not installed"}
    before = int(torch.get_num_threads())
    torch.set_num_threads(threads)
    return {"torch_threads": int(torch.get_num_threads()), "torch_threads_why": why,
            "torch_threads_default": before}
