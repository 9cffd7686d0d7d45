"""The scene shipped with Preflight, as the Python that builds it inside Blender.

The ``compute`` stage renders it (no .blend file to ship: Blender's factory scene plus
this script); ``make_blend`` saves it as a tiny .blend for the tests, the bench and the
example manifest (``python -m runner.blender.scene data/blender/shot01.blend``). The
cube turns with the frame, so every frame is a different image, and the world is lit so
no frame is one flat colour.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List, Optional

SCENE = r"""
import bpy
scene = bpy.context.scene
scene.render.engine = "CYCLES"
scene.cycles.device = "CPU"
scene.cycles.samples = {samples}
scene.cycles.use_denoising = False
scene.cycles.use_adaptive_sampling = False
scene.render.resolution_x = {width}
scene.render.resolution_y = {height}
scene.render.resolution_percentage = 100
scene.render.image_settings.file_format = "PNG"
scene.frame_start = 1
scene.frame_end = {frames}
cube = bpy.data.objects["Cube"]
cube.rotation_euler = (0.3, 0.0, 0.0)
cube.keyframe_insert("rotation_euler", frame=1)
cube.rotation_euler = (0.3, 0.0, 6.2)
cube.keyframe_insert("rotation_euler", frame={frames})
material = bpy.data.materials.new("Preflight")
material.use_nodes = True
material.node_tree.nodes["Principled BSDF"].inputs["Base Color"].default_value = (0.8, 0.3, 0.1, 1)
cube.data.materials.clear()
cube.data.materials.append(material)
world = scene.world or bpy.data.worlds.new("World")
scene.world = world
world.use_nodes = True
world.node_tree.nodes["Background"].inputs["Color"].default_value = (0.2, 0.3, 0.5, 1)
"""

SAVE = r"""
bpy.ops.wm.save_as_mainfile(filepath={path!r}, compress=True)
"""


def scene_script(width: int = 64, height: int = 64, samples: int = 4, frames: int = 24,
                 save_to: Optional[str] = None) -> str:
    """The Python that builds the shipped scene in Blender's factory startup file."""
    text = SCENE.format(width=int(width), height=int(height), samples=int(samples),
                        frames=int(frames))
    if save_to is not None:
        text += SAVE.format(path=save_to)
    return text


def make_blend(executable: str, path: str, *, width: int = 64, height: int = 64,
               samples: int = 4, frames: int = 24, extra: str = "",
               timeout: float = 120.0) -> None:
    """Save the shipped scene (plus ``extra`` Python run before saving) to ``path``."""
    script = scene_script(width, height, samples, frames) + extra + SAVE.format(
        path=os.path.abspath(path))
    proc = subprocess.run([executable, "-b", "--factory-startup", "-noaudio",
                           "--python-expr", script], stdin=subprocess.DEVNULL,
                          capture_output=True, timeout=timeout, check=False)
    if not os.path.isfile(path):
        out = proc.stdout.decode("utf-8", errors="replace")[-800:]
        raise RuntimeError(f"Blender did not save {path} (exit {proc.returncode}): {out}")


def main(argv: Optional[List[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m runner.blender.scene OUT.blend", file=sys.stderr)
        return 2
    make_blend(os.environ.get("BLENDER", "blender"), args[0])
    return 0


if __name__ == "__main__":
    sys.exit(main())
