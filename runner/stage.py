"""The stage framework: what a stage is, how it fails, and the table of stages.

The stages themselves live in ``runner/stages/`` (and ``runner/blender/stages.py``); they
import this module and nothing here imports them: the table names them as
"module:function" strings, which the watchdog resolves when a stage runs. The loop over
the table is ``runner/ladder.py``.

A stage is a function ``run(ctx: StageContext) -> dict`` returning its facts (JSON-able
values only: str, int, float, bool, None, lists and dicts of those). It reports trouble by
raising:

- ``StageFailure(stage, message, hint=None, facts=None, error_type=None, where=None)``:
  the stage failed; ``facts`` gathered so far are kept. Raise it ``from exc`` when it
  translates an exception: the error's ``type`` and ``where`` then come from that cause
  (its type name, and the deepest traceback frame in user code, else the deepest frame).
  Any other exception escaping a stage is a failure too, described the same way.
- ``StageSkipped(reason, facts=None, blocking=False)``: the stage has nothing to do
  (``extensions`` with none listed, ``evidence`` without ``results.copy_to``). A *soft* skip
  (``blocking=False``) does not count as a failure and does not stop the stages that
  depend on it; a *blocking* skip does.

``StageContext`` carries ``spec`` (runner.spec.RunSpec), ``run_dir`` (absolute path),
``resume`` (bool), ``facts`` (facts of the stages that already ran, by stage name), and
``emit(type, **data)`` to send stage-internal events (``item.done``, ``progress``), and
``beat(where)`` to say it moved (a stage judged by progress, ``StageDef.idle``). In the
watchdog worker ``emit`` relays the event to the parent process, which alone numbers and
writes events, so a stage never touches events.jsonl itself. ``ctx.device`` is the torch
device string chosen by the ``device`` stage ("cuda" or "cpu").

Standard library only at import time; the stage modules import torch inside functions.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from runner.errors import RunnerError
from runner.spec import RunSpec

Facts = Dict[str, Any]
Emit = Callable[..., Any]


class StageFailure(RunnerError):
    """A stage failed: what (message), what to do (hint), and the facts gathered so far."""

    def __init__(self, stage: str, message: str, hint: Optional[str] = None,
                 facts: Optional[Facts] = None, error_type: Optional[str] = None,
                 where: Optional[str] = None) -> None:
        super().__init__(message)
        self.stage = stage
        self.message = message
        self.hint = hint
        self.facts = dict(facts or {})
        self.error_type = error_type
        self.where = where


class StageSkipped(Exception):
    """The stage has nothing to do; ``blocking`` says whether dependents must skip too."""

    def __init__(self, reason: str, facts: Optional[Facts] = None,
                 blocking: bool = False) -> None:
        super().__init__(reason)
        self.reason = reason
        self.facts = dict(facts or {})
        self.blocking = blocking


def _no_emit(etype: str, **data: Any) -> None:
    return None


def _no_beat(where: str) -> None:
    return None


@dataclass
class StageContext:
    """What a stage may rely on; see the module docstring."""

    spec: RunSpec
    run_dir: str
    resume: bool = False
    facts: Dict[str, Facts] = field(default_factory=dict)
    emit: Emit = _no_emit
    beat: Callable[[str], None] = _no_beat  # "still moving, at <where>" (StageDef.idle)

    @property
    def device(self) -> str:
        value = self.facts.get("device", {}).get("device")
        return value if isinstance(value, str) else "cpu"


@dataclass(frozen=True)
class StageDef:
    """One row of the stage table.

    ``target`` is "module:function"; ``in_worker`` stages (those that can hang in a
    driver or user call) run in the watchdog's worker process under ``timeout_s``
    (overridable by ``spec.diagnostics.timeouts[name]``). An ``idle`` stage is judged by
    its progress instead: it fails once ``timeout_s`` pass without a ``ctx.beat`` (however
    long it runs while it moves), naming where it stopped.
    """

    name: str
    target: str
    deps: Tuple[str, ...] = ()
    in_worker: bool = False
    timeout_s: float = 300.0
    # Runs even when its dependencies failed (the evidence of a failed pilot is the most
    # useful kind); it then works with what the run produced.
    after_failure: bool = False
    idle: bool = False  # timeout_s is the longest it may go without progress
    # The spec's section this stage needs (``calibration``): without it the stage is no part
    # of the run (no event at all), not a skipped one.
    needs: str = ""


def stage_applies(stage: StageDef, spec: Any) -> bool:
    """Whether ``stage`` is part of a run of ``spec`` (its ``needs`` section is present)."""
    return not stage.needs or getattr(spec, stage.needs, None) is not None


STAGE_TABLE: Tuple[StageDef, ...] = (
    StageDef("prepare", "runner.stages.prepare:prepare", (), False, 60),
    StageDef("interpreter", "runner.stages.interpreter:interpreter", ("prepare",), False, 60),
    StageDef("environment", "runner.stages.environment:environment", ("interpreter",), False,
             120),
    StageDef("torch", "runner.stages.torch:torch_stage", ("interpreter",), True, 120),
    StageDef("device", "runner.stages.device:device", ("torch",), True, 60),
    StageDef("compute", "runner.stages.compute:compute", ("device",), True, 120),
    StageDef("interconnect", "runner.stages.interconnect:interconnect", ("compute",), True,
             300),
    StageDef("extensions", "runner.stages.extensions:extensions", ("device",), True, 300),
    StageDef("memory", "runner.stages.memory:memory", ("compute",), True, 300),
    StageDef("pilot", "runner.stages.pilot:pilot",
             ("environment", "compute", "extensions", "memory"), True, 3600),
    # a several-node volume's outputs to the head, on its own clock, judged by progress
    StageDef("collect", "runner.stages.collect:collect", ("pilot",), True, 600, idle=True,
             needs="collection"),
    StageDef("balance", "runner.stages.balance:balance", ("pilot",), False, 600),
    StageDef("calibrate", "runner.stages.calibrate:calibrate", ("balance",), True, 900,
             needs="calibration"),
    # judged by progress: a million outputs take as long as they take while they move
    StageDef("evidence", "runner.stages.evidence:evidence", ("balance",), False, 300,
             after_failure=True, idle=True),
)

STAGES_BY_NAME: Dict[str, StageDef] = {s.name: s for s in STAGE_TABLE}

# Stages a preparation proves its own way (docs/blender.md): same names, same order and
# dependencies, another function. A stage not listed keeps the table's target.
PREPARATION_TARGETS: Dict[str, Dict[str, str]] = {
    "blender": {
        "environment": "runner.blender.stages:environment",
        "torch": "runner.blender.stages:torch_not_used",
        "device": "runner.blender.stages:device",
        "compute": "runner.blender.stages:compute",
        "interconnect": "runner.blender.stages:interconnect_not_used",
        "extensions": "runner.blender.stages:extensions_not_used",
        "memory": "runner.blender.stages:memory",
    },
}


def stage_target(stage: StageDef, spec: Any) -> str:
    """The function that runs ``stage`` for this spec's preparation."""
    preparation = getattr(spec, "preparation", None)
    return PREPARATION_TARGETS.get(str(preparation), {}).get(stage.name, stage.target)


def stage_timeout(stage: StageDef, spec: RunSpec) -> float:
    """The stage's timeout in seconds: the spec's override, else the table's default.

    In a volume run the ``pilot`` stage is the volume's driver: its timeout is the
    volume's time limit (``volume.time_limit_s``: the forecast's with a margin, or the
    manifest's), not the pilot's hour."""
    volume = getattr(spec, "volume", None)
    limit = getattr(volume, "time_limit_s", 0) if volume is not None else 0
    if stage.name == "pilot" and isinstance(limit, (int, float)) and limit > 0:
        return float(limit)
    value = spec.diagnostics.timeouts.get(stage.name)
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
        return float(value)
    return float(stage.timeout_s)


__all__ = [
    "Facts", "Emit", "StageFailure", "StageSkipped", "StageContext", "StageDef",
    "STAGE_TABLE", "STAGES_BY_NAME", "stage_timeout", "stage_target", "stage_applies",
]
