"""The manifest rules of ``preparation: blender`` (docs/blender.md).

The Blender pilot renders frames itself: its inputs are ``inputs.frames`` of .blend
files, it takes no ``task.handler`` or ``task.command``, and every accepted frame has the
category ``rendered``. ``inputs.frames`` and the ``blender`` section mean nothing to other
preparations, so they are errors or warnings there rather than silently ignored.
"""

from __future__ import annotations

from typing import Any

from runner.frames import CATEGORY

# ``parts`` and ``report`` are bot.manifest.rules' Parts and Report (that module calls
# this one, so it is not imported back).
Parts = Any
Report = Any

CYCLES_FOR_BACKEND = {"cuda": {"CUDA", "OPTIX"}, "rocm": {"HIP"}, "cpu": {"CPU"}}


def check_blender(parts: Parts, has_blender_section: bool, report: Report) -> None:
    """Cross-field rules between preparation, inputs.frames, task and blender."""
    blender = parts.preparation == "blender"
    frames = parts.inputs.frames if parts.inputs is not None else None
    if not blender:
        if frames is not None:
            report.problem(("inputs", "frames"), "inputs.frames is for preparation: blender "
                           f"(preparation is {parts.preparation}); remove it")
        if has_blender_section:
            report.warn(("blender",), f"the blender section is used only with preparation: "
                        f"blender (preparation is {parts.preparation}): it is ignored")
        return
    if parts.inputs is not None and frames is None:
        report.problem(("inputs", "frames"), 'preparation blender renders frames: give '
                       'inputs.frames ("1-24" or a list) of the .blend files inputs.pattern '
                       "selects")
    if parts.volume is not None and parts.volume.inputs.frames is None:
        report.problem(("volume", "inputs", "frames"), "preparation blender renders frames: "
                       "give the volume's frames too")
    _check_task(parts, report)
    _check_device(parts, report)


def _check_task(parts: Parts, report: Report) -> None:
    task = parts.task
    if task is None:
        return
    if task.handler is not None:
        report.problem(("task", "handler"), "preparation blender renders the frames itself "
                       "(one supervised Blender process per frame): remove task.handler")
    if task.command is not None:
        report.problem(("task", "command"), "preparation blender renders the frames itself "
                       "(one supervised Blender process per frame): remove task.command")
    if task.categories and list(task.categories) != [CATEGORY]:
        report.problem(("task", "categories"), f"a rendered frame has the category "
                       f"{CATEGORY!r}; leave task.categories out or write [{CATEGORY}]")


def _check_device(parts: Parts, report: Report) -> None:
    blender = parts.blender
    if blender is None or blender.cycles_device is None or parts.backend is None:
        return
    allowed = CYCLES_FOR_BACKEND.get(parts.backend, set())
    if blender.cycles_device not in allowed:
        report.problem(("blender", "cycles_device"), f"{blender.cycles_device} does not run "
                       f"on backend {parts.backend}; expected one of: "
                       f"{', '.join(sorted(allowed))}")
