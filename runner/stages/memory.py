"""The memory stage: run the workload once on its most demanding batch and measure peaks.

The batch is the ``task.batch_size`` largest inputs. The handler's results are discarded
(outputs go to a temporary folder; nothing is recorded in the ledger): this stage only
learns whether the pilot fits. On a GPU it records every card's free memory first
(``cards_free_gib``), then torch's peak allocated and reserved memory and ``mem_get_info``
on the card the workload uses (``pilot_card``); the budget
(``diagnostics.memory_budget_gib``) is compared with the peak *reserved* memory, what the
card really gave away. On CPU it records the process's peak RSS (VmHWM, reset before the
call) and compares the budget with the peak RSS *added by the workload* (torch's own import
footprint is not the workload's).
"""

from __future__ import annotations

import resource
import shutil
import sys
import tempfile
from typing import Any, Dict, List, Optional

from runner.handler_call import call_handler
from runner.stage import StageContext, StageFailure, StageSkipped

GIB = 1024 ** 3


def memory(ctx: StageContext) -> Dict[str, Any]:
    spec = ctx.spec
    if not spec.task.handler and spec.task.kind != "train":  # train: the trainer's step
        raise StageSkipped("no in-process task.handler: memory is measured by the pilot")
    from runner.inputs import list_inputs
    from runner.workloads import load_handler, make_context

    try:
        items = list_inputs(spec)
        handler = load_handler(spec)
    except (ValueError, OSError) as exc:
        raise StageFailure("memory", str(exc), error_type=type(exc).__name__,
                           hint="check inputs.dir/pattern and task.handler") from exc
    if not items:
        raise StageSkipped(f"no inputs in {spec.inputs.dir} matching {spec.inputs.pattern!r}")
    size = max(1, int(spec.task.batch_size or 1))
    batch = sorted(items, key=lambda it: (-it.size, it.id))[:size]
    facts: Dict[str, Any] = {"batch_ids": [it.id for it in batch],
                             "batch_bytes": sum(it.size for it in batch),
                             "batch_size": size, "device": ctx.device}
    scratch = tempfile.mkdtemp(prefix="preflight-memory-")
    try:
        wctx = make_context(spec, scratch)
        if ctx.device != "cpu":
            measured = _run_on_gpu(handler, batch, wctx, facts)
        else:
            measured = _run_on_cpu(handler, batch, wctx, facts)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _check_budget(spec.diagnostics.memory_budget_gib, measured, facts)
    return facts


def _call(handler: Any, batch: List[Any], wctx: Any, facts: Dict[str, Any]) -> None:
    try:
        results = call_handler(handler, batch, wctx)  # a generator's work is run too
    except Exception as exc:  # noqa: BLE001 - a crash of the user's workload is this stage's
        raise StageFailure("memory", f"the workload failed on its largest batch "
                           f"({', '.join(facts['batch_ids'])}): {type(exc).__name__}: {exc}",
                           facts=facts) from exc
    facts["results"] = len(results) if isinstance(results, list) else None


def _run_on_gpu(handler: Any, batch: List[Any], wctx: Any, facts: Dict[str, Any]) -> float:
    import torch

    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    facts["cards_free_gib"] = cards_free(torch)
    facts["pilot_card"] = torch.cuda.current_device()
    torch.cuda.reset_peak_memory_stats()
    free_before, total = torch.cuda.mem_get_info()
    _call(handler, batch, wctx, facts)
    torch.cuda.synchronize()
    free_after, _ = torch.cuda.mem_get_info()
    reserved = torch.cuda.max_memory_reserved() / GIB
    facts.update({
        "peak_allocated_gib": round(torch.cuda.max_memory_allocated() / GIB, 4),
        "peak_reserved_gib": round(reserved, 4),
        "free_before_gib": round(free_before / GIB, 3),
        "free_after_gib": round(free_after / GIB, 3),
        "card_memory_gib": round(total / GIB, 3),
        "fraction_of_card": round(reserved * GIB / total, 4) if total else None,
        "measured": "peak_reserved_gib",
    })
    return reserved


def cards_free(torch: Any) -> Dict[str, Dict[str, Any]]:
    """Free and total memory of every card before the pilot, by index (as text)."""
    out: Dict[str, Dict[str, Any]] = {}
    for index in range(torch.cuda.device_count()):
        try:
            free, total = torch.cuda.mem_get_info(index)
        except RuntimeError as exc:  # a card that cannot even answer: say so, go on
            out[str(index)] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        out[str(index)] = {"free_gib": round(free / GIB, 3), "total_gib": round(total / GIB, 3)}
    return out


def _run_on_cpu(handler: Any, batch: List[Any], wctx: Any, facts: Dict[str, Any]) -> float:
    before = _proc_status_kib("VmRSS")
    reset = _reset_peak_rss()
    _call(handler, batch, wctx, facts)
    peak = _proc_status_kib("VmHWM") if reset else None
    if peak is None:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
        if sys.platform == "darwin":
            peak //= 1024
    before = before or 0
    added = max(0, peak - before) * 1024 / GIB
    facts.update({"rss_before_gib": round(before * 1024 / GIB, 4),
                  "peak_rss_gib": round(peak * 1024 / GIB, 4),
                  "workload_peak_gib": round(added, 4),
                  "peak_reset": reset, "measured": "workload_peak_gib"})
    return added


def _check_budget(budget: Optional[float], measured: float, facts: Dict[str, Any]) -> None:
    facts["budget_gib"] = budget
    if budget is None:
        return
    facts["fraction_of_budget"] = round(measured / budget, 4) if budget else None
    if measured > budget:
        raise StageFailure(
            "memory", f"the largest batch needs {measured:.3f} GiB "
            f"({facts['measured']}), over the memory budget of {budget:g} GiB",
            facts=facts, error_type="MemoryBudgetExceeded",
            hint="lower task.batch_size, shorten the largest inputs, or raise "
                 "diagnostics.memory_budget_gib if the card has room (see fraction_of_card)")


def _proc_status_kib(key: str) -> Optional[int]:
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except (OSError, ValueError):
        return None
    return None


def _reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False when unsupported."""
    try:
        with open("/proc/self/clear_refs", "w", encoding="ascii") as fh:
            fh.write("5")
        return _proc_status_kib("VmHWM") is not None
    except OSError:
        return False


__all__ = ["memory"]
