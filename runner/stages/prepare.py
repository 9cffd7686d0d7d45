"""The prepare stage: the run directory is writable, has the disk asked for, holds spec.json."""

from __future__ import annotations

import os
import shutil
from typing import Any, Dict

from runner import __version__
from runner.files import write_text_atomic
from runner.stage import StageContext, StageFailure

GIB = 1024 ** 3


def prepare(ctx: StageContext) -> Dict[str, Any]:
    """The run directory is writable, has the free disk asked for, and holds spec.json."""
    run_dir = ctx.run_dir
    probe = os.path.join(run_dir, f".write-probe-{os.getpid()}")
    try:
        with open(probe, "w", encoding="utf-8") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise StageFailure("prepare", f"run directory {run_dir} is not writable: "
                           f"{exc.strerror or exc}",
                           hint="give the runner a run directory it can write") from exc
    usage = shutil.disk_usage(run_dir)
    facts: Dict[str, Any] = {"run_dir": run_dir, "free_disk_gib": round(usage.free / GIB, 3),
                             "total_disk_gib": round(usage.total / GIB, 3),
                             "runner_version": __version__}
    minimum = float(ctx.spec.diagnostics.min_free_disk_gib or 0)
    facts["min_free_disk_gib"] = minimum
    if usage.free / GIB < minimum:
        raise StageFailure(
            "prepare", f"only {usage.free / GIB:.2f} GiB free on the run directory's disk, "
            f"the manifest asks for {minimum:g} GiB", facts=facts,
            hint="free disk space or lower diagnostics.min_free_disk_gib")
    facts["spec_copied"] = _copy_spec(ctx)
    if ctx.resume:
        facts["resumed"] = True
    return facts


def _copy_spec(ctx: StageContext) -> bool:
    """Put the spec in the run directory unless it is already there (the bot writes it)."""
    dest = os.path.join(ctx.run_dir, "spec.json")
    if os.path.exists(dest):
        return False
    write_text_atomic(dest, ctx.spec.to_json() + "\n")
    return True
