"""Torch's intra-op threads for the pilot: the cores the worker owns, not the machine's.

Torch starts as many intra-op threads as the machine has physical cores, whatever share of
them this process may use (an affinity mask, a container's CPU quota): on small operations
the extra threads only contend (the example classifier ran twice as fast with one thread
than with torch's default on a 2-core share). The runner sets the threads to the cores the
worker owns: the CPUs of its affinity mask, capped by the cgroup v2 CPU quota, divided by
the workers sharing them (one for the pilot). ``task.torch_threads`` overrides it. What was
chosen, and why, goes into the pilot's facts. Standard library only at import time.

The same rule reaches the work torch runs in other processes: a volume's Ray actors (the
CPUs Ray gave the actor, or the node's cores shared by the workers on it; see
``runner/volume_ray.py``), and an external command (``task.command``), which gets
``OMP_NUM_THREADS`` (torch's and OpenMP's default thread count at start) in its
environment, unless the environment the runner was started with already sets it.
"""

from __future__ import annotations

import math
import os
import sys
from typing import Any, Dict, Optional, Tuple

from runner.spec import healthy_cards

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


def worker_share(worker_cards: Optional[int],
                 facts: Optional[Dict[str, Any]] = None) -> Optional[Tuple[int, str]]:
    """The cores one of the volume's workers will own (``task.worker_cards``: its cards
    each, 0 for a CPU worker), as this node shows them: what a pilot measures with. None:
    no volume follows (the pilot keeps the cores it owns). ``facts``: the earlier stages'
    facts by stage name (the healthy cards of this node, else the device count)."""
    if worker_cards is None:
        return None
    if worker_cards < 1:
        return 1, "1 CPU, as Ray gives each CPU worker of the volume"
    cards = _node_cards(facts or {})
    workers = max(1, cards // worker_cards)
    share, how = owned_cores(workers)
    return share, (f"{how}: as each of the volume's {workers} worker(s) of "
                   f"{worker_cards} card(s) on a node of {cards} card(s)")


def _node_cards(facts: Dict[str, Any]) -> int:
    cards = healthy_cards(facts)
    if cards:
        return len(cards)
    count = (facts.get("device") or {}).get("count")
    return count if isinstance(count, int) and count > 0 else 1


def choose_threads(requested: Optional[int], workers: int = 1,
                   owned: Optional[Tuple[int, str]] = None) -> Tuple[int, str]:
    """The threads for one worker and why: ``task.torch_threads``, else the cores it owns
    (``owned`` when the caller knows them better, e.g. Ray's share for an actor)."""
    if requested:
        return int(requested), "task.torch_threads"
    threads, why = owned or owned_cores(workers)
    return threads, f"the cores the worker owns: {why}"


def command_env(requested: Optional[int],
                environ: Optional[Dict[str, str]] = None) -> Tuple[Dict[str, str], Dict[str, Any]]:
    """The environment of an external command: ``OMP_NUM_THREADS`` set to the threads
    chosen, unless already set in ours (then left as it is); and the facts saying which."""
    env = dict(os.environ if environ is None else environ)
    if env.get("OMP_NUM_THREADS") and not requested:
        return env, {"torch_threads": env["OMP_NUM_THREADS"],
                     "torch_threads_why": "OMP_NUM_THREADS already set in the runner's "
                                          "environment"}
    threads, why = choose_threads(requested)
    env["OMP_NUM_THREADS"] = str(threads)
    return env, {"torch_threads": threads, "torch_threads_why": f"{why} (OMP_NUM_THREADS)"}


def set_torch_threads(requested: Optional[int], workers: int = 1,
                      owned: Optional[Tuple[int, str]] = None,
                      import_torch: bool = True) -> Dict[str, Any]:
    """Set torch's intra-op threads (when torch is there) and say what was chosen.
    ``import_torch=False``: only when torch is already imported (``OMP_NUM_THREADS`` is
    set either way, for a torch imported later in this process)."""
    threads, why = choose_threads(requested, workers, owned)
    os.environ["OMP_NUM_THREADS"] = str(threads)
    torch: Any = sys.modules.get("torch")
    if torch is None and not import_torch:
        return {"torch_threads": threads, "torch_threads_why": why,
                "torch_threads_via": "OMP_NUM_THREADS (torch not imported yet)"}
    if torch is None:
        try:
            import torch  # noqa: F811 - the torch stage has usually imported it already
        except ImportError:
            return {"torch_threads": None, "torch_threads_why": "torch is not installed"}
    before = int(torch.get_num_threads())
    torch.set_num_threads(threads)
    return {"torch_threads": int(torch.get_num_threads()), "torch_threads_why": why,
            "torch_threads_default": before}
