"""The trainer protocol: what a team's training code provides for the training pilot.

``task.trainer`` names a module (``"pkg.mod"``) or an object in it (``"pkg.mod:obj"``; a
class is instantiated with no arguments) that provides three functions::

    read(items, params) -> (examples, refused)
        items: the shards still to process (runner.inputs.Item: id, path, size).
        examples: a sequence of training examples (a list, or a tensor whose first
        dimension indexes the examples). refused: {item id: reason} for every shard
        that cannot be used; the other shards are recorded as accepted.
    build(seed, params, device) -> (model, optimizer, scheduler or None)
        A fresh model already on ``device`` and its optimizer (python's random and
        torch are already seeded with ``seed``).
    step(model, optimizer, batch, device) -> loss
        One optimizer update: forward, backward, ``optimizer.step()``; returns the loss
        (a tensor or a float). ``batch`` is ``examples[index]`` for a tensor, else a list.

and optionally ``batch_size`` (an int, 16 when absent). The runner owns everything a
resume depends on: seeding, the data order and position, ``model.train()`` and
``scheduler.step()`` after each step, the RNG states (python, torch CPU, CUDA, numpy when
imported), the atomic checkpoint and the comparison of a resumed run with a straight one.
Without ``task.trainer`` the built-in example :mod:`runner.workloads.train` is used.
"""

from __future__ import annotations

import json
import os
import random
import sys
from typing import Any, Dict, List, Optional, Tuple

from runner.errors import RunnerError
from runner.evidence import file_sha256
from runner.files import atomic_open, write_json_atomic
from runner.inputs import Item
from runner.workloads.project import import_project_module

BUILTIN = "runner.workloads.train"
DEFAULT_BATCH = 16
FUNCTIONS = ("read", "build", "step")
MARKER = "COMPLETE"


class CheckpointError(RunnerError, RuntimeError):
    """A checkpoint is incomplete or does not match its completion marker."""


class TrainerError(RunnerError, ValueError):
    """The trainer cannot be loaded, or one of its functions failed or broke the protocol."""


class Trainer:
    """A loaded trainer: its three functions, called so that any failure names it."""

    def __init__(self, ref: str, obj: Any) -> None:
        self.ref = ref
        self._obj = obj
        size = getattr(obj, "batch_size", DEFAULT_BATCH)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise TrainerError(f"trainer {ref}: batch_size must be an int >= 1, got {size!r}")
        self.batch_size = size

    def read(self, items: List[Item], params: Dict[str, Any]) -> Tuple[Any, Dict[str, str]]:
        out = self._call("read", items, params)
        if not isinstance(out, tuple) or len(out) != 2 or not isinstance(out[1], dict):
            raise TrainerError(f"trainer {self.ref}: read must return (examples, refused) with "
                               f"refused a dict of id -> reason, got {type(out).__name__}")
        examples, refused = out
        try:
            len(examples)
        except TypeError as exc:
            raise TrainerError(f"trainer {self.ref}: read returned examples without a length "
                               f"({type(examples).__name__})") from exc
        return examples, {str(k): str(v) for k, v in refused.items()}

    def build(self, seed: int, params: Dict[str, Any], device: str) -> Tuple[Any, Any, Any]:
        out = self._call("build", seed, params, device)
        if not isinstance(out, tuple) or len(out) != 3:
            raise TrainerError(f"trainer {self.ref}: build must return "
                               f"(model, optimizer, scheduler or None), got {type(out).__name__}")
        return out

    def step(self, model: Any, optimizer: Any, batch: Any, device: str) -> float:
        loss = self._call("step", model, optimizer, batch, device)
        try:
            return float(loss.item() if hasattr(loss, "item") else loss)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TrainerError(f"trainer {self.ref}: step must return the loss (a tensor or "
                               f"a number), got {type(loss).__name__}") from exc

    def _call(self, name: str, *args: Any) -> Any:
        try:
            return getattr(self._obj, name)(*args)
        except TrainerError:
            raise
        except Exception as exc:
            raise TrainerError(f"trainer {self.ref}: {name} raised "
                               f"{type(exc).__name__}: {exc}") from exc


def load_trainer(ref: Optional[str], project_dir: Optional[str] = None) -> Trainer:
    """Import ``ref`` ("module" or "module:object"; None: the built-in example).

    ``project_dir`` goes on ``sys.path`` first, as for ``task.handler``.
    """
    ref = ref or BUILTIN
    module_name, _, attr = ref.partition(":")
    if not module_name or (":" in ref and not attr) or ":" in attr:
        raise TrainerError(f"task.trainer: expected 'module' or 'module:object', got {ref!r}")
    module = import_project_module(module_name, project_dir, f"task.trainer {ref}", TrainerError)
    obj: Any = module
    if attr:
        obj = getattr(module, attr, None)
        if obj is None:
            raise TrainerError(f"task.trainer {ref}: module {module_name!r} has no {attr!r}")
        if isinstance(obj, type):
            try:
                obj = obj()
            except Exception as exc:
                raise TrainerError(f"task.trainer {ref}: {attr}() raised "
                                   f"{type(exc).__name__}: {exc}") from exc
    missing = [f for f in FUNCTIONS if not callable(getattr(obj, f, None))]
    if missing:
        raise TrainerError(f"task.trainer {ref}: missing {', '.join(missing)} "
                           f"(a trainer provides read, build and step)")
    return Trainer(ref, obj)


# ---- the runner's side: RNG states and checkpoints ------------------------------------

def seed_all(seed: int) -> None:
    import torch

    random.seed(seed)
    torch.manual_seed(seed)  # CPU and every CUDA device
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed(seed % 2 ** 32)


def rng_state() -> Dict[str, Any]:
    import torch

    state: Dict[str, Any] = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    if "numpy" in sys.modules:
        state["numpy"] = sys.modules["numpy"].random.get_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    import torch

    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state and "numpy" in sys.modules:
        sys.modules["numpy"].random.set_state(state["numpy"])


def save_checkpoint(directory: str, state: Dict[str, Any]) -> str:
    import torch

    os.makedirs(directory, exist_ok=True)
    final = os.path.join(directory, "state.pt")
    with atomic_open(final, binary=True) as fh:
        torch.save(state, fh)
    digest = file_sha256(final)
    write_json_atomic(os.path.join(directory, MARKER), {"sha256": digest, "step": state["step"]})
    return final


def load_checkpoint(directory: str, map_location: Optional[str] = None) -> Dict[str, Any]:
    import torch

    marker = os.path.join(directory, MARKER)
    path = os.path.join(directory, "state.pt")
    try:
        with open(marker, encoding="utf-8") as fh:
            expected = json.load(fh)["sha256"]
    except (OSError, ValueError, KeyError) as exc:
        raise CheckpointError(f"{directory}: no valid {MARKER} marker (incomplete checkpoint)") \
            from exc
    if not os.path.exists(path) or file_sha256(path) != expected:
        raise CheckpointError(f"{path}: does not match its {MARKER} marker")
    return torch.load(path, map_location=map_location,  # type: ignore[no-any-return]
                      weights_only=False)


