"""The render as a task handler, for the volume's workers (one Ray actor per card).

The pilot renders on its node through ``render_items`` (one ledger transaction per frame);
the volume hands batches of frames to workers that know nothing of the ledger, so each
worker calls this handler, which renders its batch frame by frame with the same command
line and the same judgement and returns one result per frame (with the frame's
``elapsed_s``). The Cycles device type is the one the ``device`` stage chose, passed to
the worker as its device (``"optix"``, ``"cuda"``, ``"hip"``, ``"cpu"``); a worker that Ray
gave one card sees only that card (``CUDA_VISIBLE_DEVICES``), so Cycles renders on it.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Sequence

from runner.blender.cycles import GPU_BACKENDS
from runner.blender.render import RenderSetup, frame_paths, render_frame


def setup_for(spec: Any, device: str) -> RenderSetup:
    """How a worker renders: the spec's blender settings and the device it was given."""
    cfg = spec.blender
    kind = device.upper() if device.upper() in GPU_BACKENDS else "CPU"
    res = (int(cfg.resolution[0]), int(cfg.resolution[1])) if cfg.resolution else None
    return RenderSetup(executable=cfg.executable, kind=kind, addons=tuple(cfg.addons),
                       resolution=res, samples=cfg.samples, autoexec=bool(cfg.autoexec),
                       timeout_s=float(cfg.frame_timeout_s),
                       allow_uniform=bool(cfg.allow_uniform_frames))


def render(items: Sequence[Any], ctx: Any) -> List[Dict[str, Any]]:
    """Render each frame of the batch; a refused frame is a result, not an exception."""
    setup = setup_for(ctx.spec, str(getattr(ctx, "device", "cpu")))
    run_dir = os.path.dirname(os.path.abspath(ctx.outputs_dir))
    results = []
    for item in items:
        _name, frame, out_dir, log = frame_paths(run_dir, item.id)
        result = render_frame(setup, item.path, frame, out_dir, log)
        results.append({**result.to_result(item.id), "elapsed_s": result.seconds})
    return results
