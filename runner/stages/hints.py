"""Describe a stage's exception: type, message, the most relevant line, and a hint.

The hint table covers the first errors people meet on a rented GPU node; each pattern is
matched case-insensitively against "Type: message".
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
import traceback
from typing import Any, Dict, List, Optional, Tuple

from runner.stage import StageFailure

_RUNNER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

HINTS: Tuple[Tuple[str, str], ...] = (
    (r"no kernel image is available|no binary for gpu|hipErrorNoBinaryForGpu",
     "this torch (or extension) build has no kernels for this card's architecture; install "
     "a build whose arch list includes it (compute capability / gfx arch in the device facts)"),
    (r"driver version is insufficient|driver on your system is too old|"
     r"cuda driver initialization failed|forward compatibility was attempted",
     "the NVIDIA driver is older than the CUDA runtime this torch was built with; install "
     "a torch built for an older CUDA (see nvidia-smi's CUDA version) or update the driver"),
    (r"out of memory|outofmemoryerror",
     "the workload needs more memory than the device has free; lower task.batch_size, use "
     "a smaller dtype, or pick a card with more memory (see the memory facts)"),
    (r"\bhip error|hiperror|rocm",
     "a ROCm/HIP call failed; check that the torch build's HIP version matches the node's "
     "ROCm (rocm-smi) and that the card's gfx arch is supported by this build"),
    (r"cannot open shared object file|undefined symbol|dll load failed|"
     r"library not loaded|\.so[.\d]*: cannot",
     "a shared library is missing or from another version; install the runtime this "
     "package was built against (e.g. the matching CUDA/ROCm libraries) or reinstall the "
     "package for this interpreter"),
    (r"torch not compiled with cuda|found no nvidia driver|no cuda gpus are available",
     "torch cannot see a GPU: check nvidia-smi, CUDA_VISIBLE_DEVICES and that the installed "
     "torch is a CUDA build"),
    (r"modulenotfounderror|no module named",
     "install the missing module into the interpreter your project runs with (node.python; "
     "the interpreter stage shows the executable this run used), e.g. `<node.python> -m pip "
     "install NAME`, not into Preflight's own environment; check that interpreter first"),
    (r"importerror",
     "the module is installed but failed to import; check its version against torch and "
     "the interpreter (see the environment stage)"),
)


def hint_for(error_type: str, message: str) -> Optional[str]:
    """The hint for a known first error, or None."""
    text = f"{error_type}: {message}"
    for pattern, hint in HINTS:
        if re.search(pattern, text, re.IGNORECASE):
            return hint
    return None


def _library_dirs() -> List[str]:
    dirs = {_RUNNER_DIR, sys.prefix, sys.base_prefix, sys.exec_prefix}
    for key in ("stdlib", "platstdlib", "purelib", "platlib"):
        try:
            dirs.add(sysconfig.get_path(key))
        except KeyError:
            continue
    return [os.path.abspath(d) + os.sep for d in dirs if d and os.path.abspath(d) != os.sep]


def is_user_file(filename: str) -> bool:
    """A frame in the user's code: not the runner, the standard library or site-packages."""
    if not filename or filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    if "site-packages" in path or "dist-packages" in path:
        return False
    return not any(path.startswith(d) for d in _library_dirs())


def where_of(exc: BaseException) -> Optional[str]:
    """The most relevant traceback line, "file:line in func".

    The deepest frame in user code when there is one (where the user's code raised or
    called into a library), else the deepest library frame; never a frame of the runner
    itself (Preflight's own code is not where a user's problem is): None then.
    """
    frames = traceback.extract_tb(exc.__traceback__) if exc.__traceback__ else []
    user = [f for f in frames if is_user_file(f.filename)]
    other = [f for f in frames if not _is_ours(f.filename)]
    frame = user[-1] if user else (other[-1] if other else None)
    return None if frame is None else f"{frame.filename}:{frame.lineno} in {frame.name}"


def _is_ours(filename: str) -> bool:
    return os.path.abspath(filename).startswith(_RUNNER_DIR + os.sep)


def describe_error(exc: BaseException) -> Dict[str, Any]:
    """The ``error`` object of stage.failed: {type, message, where, hint}."""
    if isinstance(exc, StageFailure):
        cause = exc.__cause__
        etype = exc.error_type or (type(cause).__name__ if cause else "StageFailure")
        where = exc.where or (where_of(cause) if cause else None) or where_of(exc)
        message = exc.message
        hint = exc.hint or hint_for(etype, message)
        if hint is None and cause is not None:
            hint = hint_for(type(cause).__name__, str(cause))
    else:
        etype = type(exc).__name__
        message = str(exc) or etype
        where = where_of(exc)
        hint = hint_for(etype, message)
    return {"type": etype, "message": message, "where": where, "hint": hint}
