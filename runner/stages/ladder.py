"""The loop over the stage table: dependencies, the watchdog, events, environment.json.

Each stage emits ``stage.started`` then ``stage.passed`` / ``stage.failed`` (with ``error``)
or ``stage.skipped`` (with ``reason``); all carry ``facts`` and the passed/failed ones
``seconds``. A stage is skipped without starting when a dependency failed or was skipped
*blocking*; the reason names the root cause ("torch failed"). ``environment.json`` in the
run directory is rewritten (temp file + rename) after every stage with everything known.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from typing import Any, Dict, List, Optional

from runner import events as ev
from runner.stages import STAGE_TABLE, StageContext, StageDef, stage_timeout
from runner.watchdog import Worker, resolve_stage, run_stage_here

PASSED, FAILED, SOFT_SKIP, BLOCKED = "passed", "failed", "skipped", "blocked"


class Interrupted(Exception):
    """The runner received SIGTERM/SIGINT while a stage ran."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_interrupted(signum: int, frame: Any) -> None:
    raise Interrupted(signum)


class Ladder:
    """Runs the stage table once for one run directory."""

    def __init__(self, spec: Any, spec_path: str, run_dir: str, resume: bool,
                 writer: ev.EventWriter, table: Optional[List[StageDef]] = None) -> None:
        self.spec = spec
        self.run_dir = run_dir
        self.resume = resume
        self.writer = writer
        self.table = list(table or STAGE_TABLE)
        self.worker = Worker(spec_path, run_dir, resume)
        self.facts: Dict[str, Dict[str, Any]] = {}
        self.outcome: Dict[str, str] = {}
        self.reasons: Dict[str, str] = {}
        self.record: Dict[str, Dict[str, Any]] = {}
        self.first_error: Optional[Dict[str, Any]] = None
        self.stage_reached: Optional[str] = None
        self._current: Optional[str] = None
        self._t0 = 0.0

    # -------------------------------------------------------------- public

    def run(self) -> Dict[str, Any]:
        """Run every stage; returns the ``run.finished`` fields."""
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {s: signal.signal(s, _raise_interrupted) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            if any(s.in_worker for s in self.table):
                self.worker.start()  # its interpreter boots while the first stages run
            for stage in self.table:
                self._run_one(stage)
        except Interrupted as exc:
            self._interrupted(exc)
        finally:
            for sig, handler in old.items():
                signal.signal(sig, handler)
            self.worker.stop()
        failed = any(o in (FAILED, BLOCKED) for o in self.outcome.values())
        return {"status": "failed" if failed else "passed",
                "stage_reached": self.stage_reached, "first_error": self.first_error}

    # -------------------------------------------------------------- one stage

    def _run_one(self, stage: StageDef) -> None:
        reason = self._blocked_reason(stage)
        if reason is None:
            exists, module = resolve_stage(stage.target)
            if not exists:
                reason = "not implemented yet"
        if reason is not None:
            self._finish(stage.name, {"status": "skipped", "reason": reason, "facts": {},
                                      "blocking": True}, None, started=False)
            return
        self.stage_reached = stage.name
        self.writer.emit(ev.STAGE_STARTED, stage=stage.name)
        self._current, self._t0 = stage.name, time.monotonic()
        try:
            if stage.in_worker:
                result = self.worker.run_stage(stage.name, self.facts,
                                               stage_timeout(stage, self.spec),
                                               self.writer.emit)
            else:
                ctx = StageContext(spec=self.spec, run_dir=self.run_dir, resume=self.resume,
                                   facts=dict(self.facts), emit=self.writer.emit)
                result = run_stage_here(stage.name, ctx)
        except Interrupted:
            self.worker.kill()
            raise
        self._current = None
        self._finish(stage.name, result, time.monotonic() - self._t0, started=True)

    def _blocked_reason(self, stage: StageDef) -> Optional[str]:
        reasons: List[str] = []
        for dep in stage.deps:
            outcome = self.outcome.get(dep)
            if outcome == FAILED:
                why = f"{dep} failed"
            elif outcome == BLOCKED:
                why = self.reasons.get(dep) or f"{dep} skipped"
                if why == "not implemented yet":
                    why = f"{dep} not implemented yet"
            else:
                continue
            for part in why.split("; "):
                if part not in reasons:
                    reasons.append(part)
        return "; ".join(reasons) if reasons else None

    def _finish(self, name: str, result: Dict[str, Any], seconds: Optional[float],
                started: bool) -> None:
        status = result.get("status")
        facts = result.get("facts") or {}
        data: Dict[str, Any] = {"stage": name, "facts": facts}
        if seconds is not None:
            data["seconds"] = round(seconds, 3)
        if status == "passed":
            self.outcome[name] = PASSED
            self.writer.emit(ev.STAGE_PASSED, **data)
        elif status == "skipped":
            blocking = bool(result.get("blocking"))
            self.outcome[name] = BLOCKED if blocking else SOFT_SKIP
            self.reasons[name] = str(result.get("reason") or "skipped")
            data["reason"] = self.reasons[name]
            data["blocking"] = blocking
            self.writer.emit(ev.STAGE_SKIPPED, **data)
        else:
            self.outcome[name] = FAILED
            data["error"] = result.get("error") or {"type": "Error", "message": "failed",
                                                    "where": None, "hint": None}
            if self.first_error is None:
                self.first_error = {"stage": name, **data["error"]}
            self.writer.emit(ev.STAGE_FAILED, **data)
        self.facts[name] = facts
        record = {k: v for k, v in data.items() if k != "stage"}
        record["status"] = "skipped" if self.outcome[name] in (SOFT_SKIP, BLOCKED) else status
        self.record[name] = record
        self._write_environment()

    def _interrupted(self, exc: Interrupted) -> None:
        name = self._current
        seconds = time.monotonic() - self._t0 if name else None
        error = {"type": "Interrupted", "message": f"runner interrupted by {exc}",
                 "where": f"stage {name}" if name else None,
                 "hint": "the runner was stopped from outside; resume with --resume"}
        if name is not None and name not in self.outcome:
            self._finish(name, {"status": "failed", "facts": {}, "error": error}, seconds,
                         started=True)
        elif self.first_error is None:
            self.first_error = {"stage": name, **error}
            self.outcome["interrupted"] = FAILED

    # -------------------------------------------------------------- environment.json

    def _write_environment(self) -> None:
        doc = {"run": self.spec.run_id, "updated": ev.utc_now(),
               "first_error": self.first_error, "stages": self.record}
        write_json_atomic(os.path.join(self.run_dir, "environment.json"), doc)


def write_json_atomic(path: str, doc: Any) -> None:
    """Write JSON to ``path`` via a temp file in the same directory and a rename."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True, default=str)
        fh.write("\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
