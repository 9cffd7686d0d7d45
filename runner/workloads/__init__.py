"""In-process task handlers: how the runner finds and calls the user's function.

A handler is ``module:function`` (``task.handler``); it is called with a batch of
:class:`runner.inputs.Item` and a :class:`WorkloadContext`, and returns one dict per item:
``{"id", "status": "accepted"|"refused", "category"?, "reason"?, "output"?}``. The runner
never trusts that list: it audits ids, duplicates and categories before recording it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List

from runner.errors import RunnerError
from runner.files import write_bytes_atomic
from runner.inputs import Item
from runner.spec import RunSpec
from runner.workloads.project import import_project_module

Handler = Callable[[List[Item], "WorkloadContext"], List[Dict[str, Any]]]


class HandlerError(RunnerError, ValueError):
    """``task.handler`` is malformed, cannot be imported, or is not callable."""


@dataclass
class WorkloadContext:
    """What a handler may rely on besides its batch of items.

    ``device`` is ``"cuda"`` when the spec's backend is cuda/rocm and torch sees a GPU,
    ``"cpu"`` otherwise; ``outputs_dir`` is where accepted outputs go (write them with
    :func:`write_output`, which is atomic); ``params`` merges ``project.params`` and
    ``task.params`` (task wins).
    """

    spec: RunSpec
    device: str = "cpu"
    params: Dict[str, Any] = field(default_factory=dict)
    outputs_dir: str = "outputs"


def load_handler(spec: RunSpec) -> Handler:
    """Resolve ``spec.task.handler`` ("module:function") to a callable.

    ``project.dir`` is put on ``sys.path`` first, so a project's own ``src`` package or
    top-level module resolves the way it does on the user's machine. With ``preparation:
    blender`` the handler is the render (runner.blender.handler), and with ``task.kind:
    train`` one step of the trainer (runner.workloads.train.handle), whatever task.handler
    says.
    """
    if spec.preparation == "blender":  # the volume's workers render frames
        from runner.blender.handler import render

        return render
    if spec.task.kind == "train":  # the trainer's one-step form, whatever task.handler says
        from runner.workloads.train import handle

        return handle
    ref = spec.task.handler
    if not isinstance(ref, str) or ref.count(":") != 1:
        raise HandlerError(f"task.handler: expected 'module:function', got {ref!r}")
    module_name, func_name = ref.split(":")
    if not module_name or not func_name:
        raise HandlerError(f"task.handler: expected 'module:function', got {ref!r}")
    project_dir = spec.project.dir
    module = import_project_module(module_name, project_dir, f"task.handler {ref}", HandlerError)
    func = getattr(module, func_name, None)
    if func is None or not callable(func):
        raise HandlerError(f"task.handler {ref}: {module_name} has no callable {func_name!r}")
    return func  # type: ignore[no-any-return]


def make_context(spec: RunSpec, outputs_dir: str) -> WorkloadContext:
    params: Dict[str, Any] = {}
    params.update(spec.project.params or {})
    params.update(spec.task.params or {})
    return WorkloadContext(spec=spec, device=pick_device(spec.backend), params=params,
                           outputs_dir=outputs_dir)


def pick_device(backend: str) -> str:
    """``cuda`` when the backend asks for a GPU and torch sees one, else ``cpu``."""
    if backend not in ("cuda", "rocm"):
        return "cpu"
    try:
        import torch
    except ImportError:
        return "cpu"
    return "cuda" if torch.cuda.is_available() else "cpu"


def write_output(outputs_dir: str, item_id: str, data: bytes, suffix: str = ".json") -> str:
    """Write one item's output atomically (temp file, fsync, rename); return its path.

    A crash at any instant leaves either the previous state or the complete file, never
    a truncated one under the final name; the ledger marks the item done only afterwards.
    """
    os.makedirs(outputs_dir, exist_ok=True)
    final = os.path.join(outputs_dir, item_id + suffix)
    write_bytes_atomic(final, data)
    return final
