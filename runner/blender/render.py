"""Rendering frames: the Blender command line, one supervised process per frame, the image
checked, the outcome recorded in the ledger like any other input.

Every render uses the same invocation (the bench's bare loop runs it too)::

    blender -b --factory-startup -noaudio [-y] FILE.blend [--addons a,b]
            --python-expr SETUP -o OUT/#### -F PNG -x 1 -f N

``SETUP`` selects the Cycles device the ``device`` stage chose, applies the manifest's
resolution and samples when given, prints the resolution the frame asks for, and stops
with Blender's own "Path ... not found" report when a file the scene needs is missing
(Cycles would otherwise render it pink without a word). A frame is refused with the first
error of its log (a missing file, a Python error in a handler, a device out of memory),
a timeout, or the image check's finding; accepted with category ``rendered`` otherwise.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Sequence, Tuple

from runner.blender.png import ImageError, check_image
from runner.blender.process import (
    BlenderNotFound,
    Outcome,
    first_error,
    peak_memory_mib,
    run_blender,
    saved_paths,
)
from runner.frames import CATEGORY, split_frame_id
from runner.recording import ItemRecorder

INFO_MARKER = "PREFLIGHT_RENDER "
MISSING_EXIT = 3

SETUP = r"""
import bpy, json, os, sys
kind, resolution, samples = {kind!r}, {resolution!r}, {samples!r}
scene = bpy.context.scene
missing = sorted(p for p in bpy.utils.blend_paths(absolute=True)
                 if p and not os.path.exists(p) and "#" not in p and "<UDIM>" not in p)
if missing:
    bpy.ops.file.report_missing_files()
    sys.stdout.flush()
    sys.exit({missing_exit})
if scene.render.engine == "CYCLES":
    if kind == "CPU":
        scene.cycles.device = "CPU"
    else:
        prefs = bpy.context.preferences.addons["cycles"].preferences
        prefs.compute_device_type = kind
        for device in prefs.get_devices_for_type(kind):
            device.use = device.type == kind
        scene.cycles.device = "GPU"
    if samples:
        scene.cycles.samples = samples
if resolution:
    scene.render.resolution_x, scene.render.resolution_y = resolution
    scene.render.resolution_percentage = 100
pct = scene.render.resolution_percentage
print("PREFLIGHT_RENDER " + json.dumps({{
    "width": scene.render.resolution_x * pct // 100,
    "height": scene.render.resolution_y * pct // 100,
    "engine": scene.render.engine, "device": kind}}), flush=True)
"""


@dataclass(frozen=True)
class RenderSetup:
    """How every frame of a run is rendered (from the spec and the device stage)."""

    executable: str
    kind: str = "CPU"
    addons: Tuple[str, ...] = ()
    resolution: Optional[Tuple[int, int]] = None
    samples: Optional[int] = None
    autoexec: bool = False
    timeout_s: float = 600.0
    allow_uniform: bool = False


def render_argv(setup: RenderSetup, blend: str, frame: int, out_pattern: str,
                pre_script: Optional[str] = None) -> List[str]:
    """The command line that renders ``frame`` of ``blend`` to ``out_pattern``
    (``####`` is replaced by Blender with the frame number). ``pre_script`` builds a scene
    first (the compute stage's shipped scene, on Blender's factory file)."""
    argv = [setup.executable, "-b", "--factory-startup", "-noaudio",
            "-y" if setup.autoexec else "-Y"]
    if blend:
        argv.append(blend)
    if setup.addons:
        argv += ["--addons", ",".join(setup.addons)]
    if pre_script:
        argv += ["--python-expr", pre_script]
    script = SETUP.format(kind=setup.kind, missing_exit=MISSING_EXIT,
                          resolution=list(setup.resolution) if setup.resolution else None,
                          samples=setup.samples)
    argv += ["--python-expr", script, "-o", out_pattern, "-F", "PNG", "-x", "1",
             "-f", str(frame)]
    return argv


@dataclass(frozen=True)
class FrameResult:
    """One rendered (or refused) frame."""

    status: str
    reason: Optional[str]
    image: Optional[str]
    seconds: float
    peak_device_mib: Optional[float]
    log_path: str

    def to_result(self, iid: str) -> Dict[str, Any]:
        if self.status == "accepted":
            return {"id": iid, "status": "accepted", "category": CATEGORY,
                    "output": self.image}
        return {"id": iid, "status": "refused", "reason": self.reason}


def render_frame(setup: RenderSetup, blend: str, frame: int, out_dir: str, log_path: str,
                 pre_script: Optional[str] = None) -> FrameResult:
    """Render one frame and judge it; BlenderNotFound when Blender cannot start."""
    os.makedirs(out_dir, exist_ok=True)
    argv = render_argv(setup, blend, frame, os.path.join(out_dir, "####"), pre_script)
    outcome = run_blender(argv, log_path, setup.timeout_s, cwd=os.path.dirname(blend) or None)
    return judge(outcome, frame, out_dir, setup.allow_uniform)


def judge(outcome: Outcome, frame: int, out_dir: str, allow_uniform: bool) -> FrameResult:
    """Accept the frame only when Blender ended cleanly, its log has no error and the
    image passes the check; otherwise refuse it with the first reason found."""
    log = outcome.log()
    peak = peak_memory_mib(log)
    saved = saved_paths(log)
    image = saved[-1] if saved else os.path.join(out_dir, f"{frame:04d}.png")
    reason = _refusal(outcome, log, image, allow_uniform)
    return FrameResult("refused" if reason else "accepted", reason,
                       None if reason else image, round(outcome.seconds, 3), peak,
                       outcome.log_path)


def _refusal(outcome: Outcome, log: str, image: str, allow_uniform: bool) -> Optional[str]:
    if outcome.timed_out:
        return f"timed out after {outcome.seconds:.1f} s (blender.frame_timeout_s)"
    error = first_error(log)
    if error:
        return error
    if outcome.returncode != 0:
        return f"blender exited with code {outcome.returncode}"
    try:
        check_image(image, asked_resolution(log), allow_uniform)
    except ImageError as exc:
        return str(exc)
    return None


def asked_resolution(log: str) -> Optional[Tuple[int, int]]:
    """The resolution the setup script printed for this frame."""
    for line in log.splitlines():
        if line.startswith(INFO_MARKER):
            try:
                info = json.loads(line[len(INFO_MARKER):])
                return int(info["width"]), int(info["height"])
            except (ValueError, KeyError, TypeError):
                return None
    return None


def frame_paths(run_dir: str, iid: str) -> Tuple[str, int, str, str]:
    """(.blend name, frame, output folder, log file) of a frame id inside a run."""
    name, frame = split_frame_id(iid)
    base = os.path.join(run_dir, "outputs", "frames", name)
    log = os.path.join(run_dir, "blender", "logs", f"{name}.{frame:04d}.log")
    return name, frame, base, log


def render_items(setup: RenderSetup, run_dir: str, items: Sequence[Any],
                 recorder: ItemRecorder) -> Dict[str, Any]:
    """Render each item (a frame of a .blend) and record it before the next starts, so a
    killed runner loses at most the frame in progress. Returns the pilot's facts."""
    seconds: List[float] = []
    peaks: List[float] = []
    refused = 0
    for item in items:
        _name, frame, out_dir, log = frame_paths(run_dir, item.id)
        try:
            result = render_frame(setup, item.path, frame, out_dir, log)
        except BlenderNotFound as exc:
            raise RenderError(str(exc)) from exc
        recorder.record([item.id], [result.to_result(item.id)], elapsed_s=result.seconds)
        seconds.append(result.seconds)
        if result.peak_device_mib is not None:
            peaks.append(result.peak_device_mib)
        refused += result.status == "refused"
    return {"rendered": len(seconds), "refused_frames": refused,
            "frame_seconds_max": max(seconds) if seconds else None,
            "frame_seconds_mean": round(sum(seconds) / len(seconds), 3) if seconds else None,
            "peak_device_mib": max(peaks) if peaks else None,
            "cycles_device": setup.kind}


class RenderError(RuntimeError):
    """Blender could not be started at all (not a refusal of one frame)."""
