"""The ladder's stages for ``preparation: blender``.

``environment`` (the executable, its version, add-ons, licences), ``device`` (Cycles'
view of the node), ``compute`` (the shipped scene rendered on the chosen device, and on
the CPU for a ratio), ``memory`` (the peak device memory Blender reports for the first
frame, against the card). ``torch`` and ``extensions`` are soft skips: a render needs
neither. The pilot's frame loop is ``runner.blender.render``. Standard library only.
"""

from __future__ import annotations

import os
import time
from dataclasses import replace
from typing import Any, Dict, List, Optional

from runner.blender import checks
from runner.blender.cycles import NoDevice, ProbeError, choose_device, parse_probe
from runner.blender.handler import setup_for
from runner.blender.process import BlenderNotFound, first_error, host_peak_mib, render_seconds
from runner.blender.render import FrameResult, RenderSetup, render_frame
from runner.blender.scene import scene_script
from runner.recording import ItemRecorder
from runner.stage import StageContext, StageFailure, StageSkipped

GIB_MIB = 1024.0
COMPUTE_SIZE, COMPUTE_SAMPLES = 128, 16


def environment(ctx: StageContext) -> Dict[str, Any]:
    """Blender is found, at a good version, with its add-ons and licences; the project's
    requirements file, when the manifest names one, is checked as for any pilot."""
    from runner.requirements import check_project_requirements

    cfg = ctx.spec.blender
    exe = checks.find_executable(cfg.executable)
    facts: Dict[str, Any] = {"executable": cfg.executable, "path": exe}
    if ctx.spec.project.requirements:
        facts["requirements"] = check_project_requirements(ctx.spec)
    if exe is None:
        raise StageFailure("environment", f"Blender executable {cfg.executable!r} not found"
                           + (" on PATH" if os.sep not in cfg.executable else ""),
                           facts=facts, error_type="BlenderNotFound",
                           hint="install Blender on the node or set blender.executable to "
                                "its path")
    try:
        facts["version"] = checks.blender_version(exe)
    except checks.CheckError as exc:
        raise StageFailure("environment", str(exc), facts=facts,
                           error_type="BlenderUnusable") from exc
    _check_version(facts, cfg.version)
    if cfg.addons:
        _check_addons(exe, list(cfg.addons), facts)
    licenses = [checks.check_license(e) for e in cfg.licenses]
    facts["licenses"] = licenses
    if any(not f["ok"] for f in licenses):
        raise StageFailure("environment", checks.describe_licenses(licenses), facts=facts,
                           error_type="LicenseMissing",
                           hint="make the licence available to the render user on this node")
    return facts


def _check_version(facts: Dict[str, Any], wanted: Optional[str]) -> None:
    if not wanted:
        return
    from runner.versions import VersionError, satisfies

    facts["wanted"] = wanted
    try:
        ok, _matcher = satisfies(facts["version"], wanted)
    except VersionError as exc:
        raise StageFailure("environment", f"blender.version {wanted!r} cannot be read: {exc}",
                           facts=facts) from exc
    facts["matches"] = ok
    if not ok:
        raise StageFailure("environment", f"Blender {facts['version']} ({facts['path']}) does "
                           f"not satisfy blender.version {wanted!r}", facts=facts,
                           error_type="WrongBlenderVersion",
                           hint="install the Blender version the project was made with, or "
                                "point blender.executable at it")


def _check_addons(exe: str, names: List[str], facts: Dict[str, Any]) -> None:
    try:
        found = checks.check_addons(exe, names)
    except checks.CheckError as exc:
        raise StageFailure("environment", str(exc), facts=facts) from exc
    facts["addons"] = found
    bad = [f"{n} ({'not installed' if not s['installed'] else 'does not enable'})"
           for n, s in found.items() if not s["enabled"]]
    if bad:
        raise StageFailure("environment", "Blender add-ons not usable: " + ", ".join(bad),
                           facts=facts, error_type="AddonMissing",
                           hint="install the add-ons into this Blender (scripts/addons) and "
                                "check they enable in the background")


def torch_not_used(ctx: StageContext) -> Dict[str, Any]:
    raise StageSkipped("preparation blender: frames are rendered by Blender's Cycles, "
                       "torch is not used")


def interconnect_not_used(ctx: StageContext) -> Dict[str, Any]:
    raise StageSkipped("preparation blender: Cycles shares a frame between its devices "
                       "itself; there is no collective to measure")


def extensions_not_used(ctx: StageContext) -> Dict[str, Any]:
    raise StageSkipped("preparation blender: add-ons are checked by the environment stage")


def device(ctx: StageContext) -> Dict[str, Any]:
    """Cycles' backends and devices; the device the renders use; enough cards."""
    exe = _exe(ctx, "device")
    from runner.blender.cycles import PROBE

    t0 = time.monotonic()
    try:
        _code, out = checks.run_capture([exe, "-b", "--factory-startup", "-noaudio",
                                         "--python-expr", PROBE], 120.0)
        view = parse_probe(out)
    except (checks.CheckError, ProbeError) as exc:
        raise StageFailure("device", f"cannot read Cycles' devices: {exc}",
                           error_type="CyclesProbeFailed") from exc
    facts: Dict[str, Any] = {"probe_seconds": round(time.monotonic() - t0, 3),
                             "cycles": view.to_facts(), "seen": view.describe()}
    cfg = ctx.spec.blender
    try:
        kind, devices = choose_device(view, ctx.spec.backend, cfg.cycles_device)
    except NoDevice as exc:
        raise StageFailure("device", str(exc), facts=facts, error_type="NoCyclesDevice",
                           hint="install the GPU driver Blender needs (CUDA/OptiX for NVIDIA, "
                                "HIP for AMD) or use a Blender build with that backend") from exc
    facts.update({"cycles_device": kind, "devices": [d["name"] for d in devices],
                  "count": len(devices), "device": "cpu" if kind == "CPU" else kind.lower()})
    wanted = ctx.spec.hardware.expected_cards()  # this node's share of the rent
    if kind != "CPU" and len(devices) < wanted:
        raise StageFailure("device", f"Cycles sees {len(devices)} {kind} device(s), this node "
                           f"has {wanted} card(s) rented: {view.describe()}", facts=facts,
                           error_type="MissingCards")
    return facts


def _exe(ctx: StageContext, stage: str) -> str:
    path = ctx.facts.get("environment", {}).get("path") or checks.find_executable(
        ctx.spec.blender.executable)
    if not path:
        raise StageFailure(stage, f"Blender executable {ctx.spec.blender.executable!r} not "
                           "found", error_type="BlenderNotFound")
    return str(path)


def render_setup(ctx: StageContext, stage: str, kind: Optional[str] = None) -> RenderSetup:
    """How this run renders: the device stage's choice and the manifest's settings."""
    chosen = kind or ctx.facts.get("device", {}).get("cycles_device") or "CPU"
    return replace(setup_for(ctx.spec, str(chosen)), executable=_exe(ctx, stage))


def _bench(ctx: StageContext, setup: RenderSetup, tag: str) -> FrameResult:
    base = os.path.join(ctx.run_dir, "blender", "compute")
    script = scene_script(COMPUTE_SIZE, COMPUTE_SIZE, COMPUTE_SAMPLES, frames=2)
    try:
        return render_frame(setup, "", 1, os.path.join(base, tag),
                            os.path.join(base, f"{tag}.log"), pre_script=script)
    except BlenderNotFound as exc:
        raise StageFailure("compute", str(exc), error_type="BlenderNotFound") from exc


def compute(ctx: StageContext) -> Dict[str, Any]:
    """The shipped scene rendered on the chosen device, and on the CPU for the ratio."""
    setup = replace(render_setup(ctx, "compute"), resolution=None, samples=None, addons=(),
                    autoexec=False, allow_uniform=False)
    facts: Dict[str, Any] = {"scene": f"shipped cube, {COMPUTE_SIZE}x{COMPUTE_SIZE}, "
                                      f"{COMPUTE_SAMPLES} samples", "cycles_device": setup.kind}
    result = _bench(ctx, setup, setup.kind.lower())
    facts["seconds"] = result.seconds
    facts["render_seconds"] = _render_seconds(result)
    if result.status != "accepted":
        raise StageFailure("compute", f"the benchmark render on {setup.kind} failed: "
                           f"{result.reason}", facts=facts, error_type="RenderFailed",
                           hint=f"see {result.log_path}")
    if setup.kind == "CPU":
        facts["cpu_ratio"] = None
        facts["note"] = "the chosen device is the CPU: no CPU reference to compare"
        return facts
    if not ctx.spec.blender.compute_cpu_reference:
        facts["cpu_ratio"] = None
        facts["note"] = "blender.compute_cpu_reference is off"
        return facts
    cpu_setup = replace(setup, kind="CPU",
                        timeout_s=max(30.0, min(300.0, 20 * result.seconds)))
    cpu = _bench(ctx, cpu_setup, "cpu")
    cpu_render = _render_seconds(cpu) if cpu.status == "accepted" else None
    facts["cpu_seconds"] = cpu.seconds if cpu.status == "accepted" else None
    facts["cpu_render_seconds"] = cpu_render
    device_render = facts["render_seconds"]
    facts["cpu_ratio"] = round(cpu_render / device_render, 2) \
        if cpu_render is not None and device_render else None
    if cpu.status != "accepted":
        facts["note"] = f"CPU reference not measured: {cpu.reason}"
    return facts


def _render_seconds(result: FrameResult) -> Optional[float]:
    """Blender's own render time (its " Time:" line less saving), else the wall time."""
    try:
        with open(result.log_path, encoding="utf-8", errors="replace") as fh:
            seconds = render_seconds(fh.read())
    except OSError:
        seconds = None
    return seconds if seconds is not None else result.seconds


def memory(ctx: StageContext) -> Dict[str, Any]:
    """The first frame's peak device memory, as Blender reports it, against the card."""
    from runner.blender.render import frame_paths
    from runner.inputs import InputsError, list_inputs

    try:
        items = list_inputs(ctx.spec)
    except InputsError as exc:
        raise StageFailure("memory", str(exc), hint="check inputs.dir and inputs.frames") from exc
    if not items:
        raise StageSkipped("no frame to measure")
    item = items[0]
    _name, frame, _out, _log = frame_paths(ctx.run_dir, item.id)
    base = os.path.join(ctx.run_dir, "blender", "memory")
    try:
        result = render_frame(render_setup(ctx, "memory"), item.path, frame,
                              base, os.path.join(base, "memory.log"))
    except BlenderNotFound as exc:
        raise StageFailure("memory", str(exc), error_type="BlenderNotFound") from exc
    with open(result.log_path, encoding="utf-8", errors="replace") as fh:
        log = fh.read()
    facts: Dict[str, Any] = {"frame": item.id, "peak_device_mib": result.peak_device_mib,
                             "host_peak_mib": host_peak_mib(log), "seconds": result.seconds,
                             "frame_status": result.status}
    if result.peak_device_mib is None:
        raise StageFailure("memory", f"Blender reported no device memory for {item.id}: "
                           f"{first_error(log) or result.reason or 'no render status lines'}",
                           facts=facts, error_type="NoMemoryReport",
                           hint=f"see {result.log_path}")
    return _against_card(ctx, facts, result.peak_device_mib)


def _against_card(ctx: StageContext, facts: Dict[str, Any], peak: float) -> Dict[str, Any]:
    card = ctx.spec.hardware.memory_gib
    budget = ctx.spec.diagnostics.memory_budget_gib
    facts["card_gib"] = card
    facts["budget_gib"] = budget
    kind = ctx.facts.get("device", {}).get("cycles_device") or "CPU"
    if card and kind != "CPU":
        facts["share_of_card"] = round(peak / (card * GIB_MIB), 4)
        if peak > card * GIB_MIB:
            raise StageFailure("memory", f"the frame peaks at {peak / GIB_MIB:.2f} GiB of device "
                               f"memory, the card has {card:g} GiB", facts=facts,
                               error_type="FrameTooLarge")
    if budget and peak > budget * GIB_MIB:
        raise StageFailure("memory", f"the frame peaks at {peak / GIB_MIB:.2f} GiB of device "
                           f"memory, over diagnostics.memory_budget_gib {budget:g} GiB",
                           facts=facts, error_type="OverBudget")
    return facts


def render_pilot(ctx: StageContext, remaining: List[Any],
                 recorder: ItemRecorder) -> Dict[str, Any]:
    """The pilot's work for the Blender preparation: render each remaining frame."""
    from runner.blender.render import RenderError, render_items

    setup = render_setup(ctx, "pilot")
    try:
        return render_items(setup, ctx.run_dir, remaining, recorder)
    except RenderError as exc:
        raise StageFailure("pilot", str(exc), error_type="BlenderNotFound",
                           hint="the frames recorded so far are kept; fix and resume") from exc
