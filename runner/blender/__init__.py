"""The Blender preparation: Cycles probed, frames rendered, images checked.

Standard library only at import time, like the rest of the runner: Blender itself is an
external program the runner starts and supervises (``blender -b ...``), never a module it
imports. ``frames`` turns ``inputs.frames`` into input ids (``shot01.blend#0007``),
``cycles`` reads Cycles' view of the node, ``png`` checks a rendered image, ``process``
runs one Blender process under a timeout and reads its log, ``stages`` holds the ladder's
stages for ``preparation: blender`` and ``render`` the pilot's frame loop.
"""
