"""The loop over the stage table: dependencies, timeouts, signals, events, environment.json.

Each stage emits ``stage.started`` then ``stage.passed`` / ``stage.failed`` (with ``error``)
or ``stage.skipped`` (with ``reason``); all carry ``facts`` and the passed/failed ones
``seconds``. A stage is skipped without starting when a dependency failed or was skipped
*blocking*; the reason names the root cause ("torch failed"). ``environment.json`` in the
run directory is rewritten (temp file + rename) after every stage with everything known.

Every stage runs under its timeout. Worker stages are killed with the worker's process
group. Stages that run in the runner process (prepare, interpreter, environment, balance,
evidence) run in a thread the ladder waits on: past the timeout the stage fails, the
thread is abandoned (a call blocked in the kernel, e.g. on a hung network file system,
cannot be killed) and can no longer emit events, and the ladder goes on.

A several-node volume's head takes each card stage its card proof of this dispatch passed
on this node from that proof, marked ``proven_by``, instead of running it again
(``runner.proven``); a pilot, and any stage the proof did not pass, runs.

In a volume's run a card stage (device, compute, interconnect) that failed only for
judging cards, with healthy cards left, passes with its verdict as a warning: the volume
goes on with the healthy cards (``runner.cards.tolerate_card_verdict``).

SIGTERM/SIGINT fail the current stage with ``Interrupted`` and skip every later stage with
the reason "runner interrupted by SIGTERM"; ``run.finished`` is still written. A signal
that arrives while an event or environment.json is being written is held until the write
is complete, so the files stay whole; further signals while the run winds up are ignored.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from contextlib import contextmanager
from typing import Any, Dict, Iterator, List, Optional

from runner import events as ev
from runner.cards import tolerate_card_verdict
from runner.files import write_json_atomic
from runner.spec import RunSpec
from runner.stage import (
    STAGE_TABLE,
    StageContext,
    StageDef,
    stage_applies,
    stage_target,
    stage_timeout,
)
from runner.watchdog import Worker, resolve_stage, run_stage_here, timed_out_result

PASSED, FAILED, SOFT_SKIP, BLOCKED = "passed", "failed", "skipped", "blocked"


class Interrupted(BaseException):
    """The runner received SIGTERM/SIGINT. A BaseException, like KeyboardInterrupt, so a
    stage's ``except Exception`` cannot swallow it."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Gate:
    """The ``emit`` of a stage run in a thread: closed once the ladder stops waiting."""

    def __init__(self, emit: Any, lock: Any) -> None:
        self._emit = emit
        self._lock = lock
        self.closed = False

    def emit(self, etype: str, **data: Any) -> Any:
        with self._lock:
            if self.closed:
                raise RuntimeError("stage abandoned after its timeout: event not written")
            return self._emit(etype, **data)

    def close(self) -> None:
        with self._lock:
            self.closed = True


class _Pulse:
    """The last sign of progress of a stage judged by it: when, and where it was."""

    def __init__(self) -> None:
        self.last = time.monotonic()
        self.where = "its start (no progress reported)"

    def beat(self, where: str) -> None:
        self.where, self.last = where, time.monotonic()  # plain stores: no lock needed

    def wait(self, done: threading.Event, idle_s: float) -> bool:
        """True once ``done`` is set; False when ``idle_s`` pass without a beat."""
        while True:
            left = self.last + idle_s - time.monotonic()
            if left <= 0:
                return done.is_set()
            if done.wait(min(left, 5.0)):
                return True


class Ladder:
    """Runs the stage table once for one run directory."""

    def __init__(self, spec: RunSpec, spec_path: str, run_dir: str, resume: bool,
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
        self._lock = threading.RLock()  # one writer of events.jsonl at a time
        self._defer = False  # a signal now is held until the write in progress is done
        self._pending: Optional[int] = None
        self._proof: Optional[Dict[str, Dict[str, Any]]] = None

    # -------------------------------------------------------------- public

    def run(self) -> Dict[str, Any]:
        """Run every stage; returns the ``run.finished`` fields."""
        old = {}
        if threading.current_thread() is threading.main_thread():
            old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            if any(s.in_worker for s in self.table):
                self.worker.start()  # its interpreter boots while the first stages run
            for stage in self.table:
                self._run_one(stage)
        except Interrupted as exc:
            self._interrupted(exc)
        finally:
            self.worker.stop()
            for sig, handler in old.items():
                signal.signal(sig, handler)
        failed = any(o in (FAILED, BLOCKED) for o in self.outcome.values())
        return {"status": "failed" if failed else "passed",
                "stage_reached": self.stage_reached, "first_error": self.first_error}

    # -------------------------------------------------------------- signals

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._defer:
            self._pending = self._pending or signum
            return
        self._defer = True  # from now on the run winds up: later signals are held
        raise Interrupted(signum)

    @contextmanager
    def _critical(self) -> Iterator[None]:
        """Hold signals while the files are written; raise a held one afterwards."""
        outer = self._defer
        self._defer = True
        try:
            with self._lock:
                yield
        finally:
            self._defer = outer
        if not outer and self._pending is not None:
            self._defer = True
            raise Interrupted(self._pending)

    def _emit(self, etype: str, **data: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            with self._lock:  # a stage thread: signals go to the main thread anyway
                return self.writer.emit(etype, **data)
        with self._critical():
            return self.writer.emit(etype, **data)

    # -------------------------------------------------------------- one stage

    def _run_one(self, stage: StageDef) -> None:
        if not stage_applies(stage, self.spec):
            return  # no part of this run (a pilot without a volume has no calibration)
        reason = None if stage.after_failure else self._blocked_reason(stage)
        if reason is None:
            exists, module = resolve_stage(stage_target(stage, self.spec))
            if not exists:
                reason = "not implemented yet"
        if reason is not None:
            self._finish(stage.name, {"status": "skipped", "reason": reason, "facts": {},
                                      "blocking": True}, None, started=False)
            return
        if not (stage.after_failure and self.first_error):  # the stage a failure reached
            self.stage_reached = stage.name
        self._current, self._t0 = stage.name, time.monotonic()
        self._emit(ev.STAGE_STARTED, stage=stage.name)
        proven = self._proven().get(stage.name)
        if proven is not None:  # a volume head's card stage its card proof just passed
            self._finish(stage.name, proven, proven.get("seconds"), started=True)
            return
        timeout = stage_timeout(stage, self.spec)
        try:
            if stage.in_worker:
                result = self.worker.run_stage(stage.name, self.facts, timeout, self._emit,
                                               idle=stage.idle)
            else:
                result = self._run_in_thread(stage.name, timeout,
                                             stage_target(stage, self.spec), stage.idle)
        except Interrupted:
            self.worker.kill()
            raise
        result = tolerate_card_verdict(self.spec, stage.name, result)  # a volume's cards
        error = result.get("error") or {}
        if stage.name == "pilot" and error.get("type") == "Timeout":
            from runner.stages.batches import in_flight

            error["message"] = f"{error.get('message')}; {in_flight(self.spec, self.run_dir)}"
        self._finish(stage.name, result, time.monotonic() - self._t0, started=True)

    def _proven(self) -> Dict[str, Dict[str, Any]]:
        """The card stages taken from this volume head's card proof (read once)."""
        if self._proof is None:
            from runner.proven import proof_stages

            self._proof = proof_stages(self.spec)
        return self._proof

    def _run_in_thread(self, name: str, timeout: float, function: Optional[str] = None,
                       idle: bool = False) -> Dict[str, Any]:
        """Run a runner-process stage in a thread; fail it when it outlives ``timeout`` (an
        ``idle`` stage: when ``timeout`` passes without its ``ctx.beat``)."""
        gate = _Gate(self._emit, self._lock)
        pulse = _Pulse()
        ctx = StageContext(spec=self.spec, run_dir=self.run_dir, resume=self.resume,
                           facts=dict(self.facts), emit=gate.emit, beat=pulse.beat)
        box: Dict[str, Dict[str, Any]] = {}
        done = threading.Event()

        def target() -> None:
            try:
                box["result"] = run_stage_here(name, ctx, function)
            except BaseException as exc:  # noqa: BLE001 - SystemExit from a stage: a failure
                from runner.stages.hints import describe_error

                box["result"] = {"status": "failed", "facts": {}, "error": describe_error(exc)}
            finally:
                done.set()

        thread = threading.Thread(target=target, name=f"stage-{name}", daemon=True)
        thread.start()
        try:
            finished = pulse.wait(done, timeout) if idle else done.wait(timeout)
        finally:
            if not done.is_set():
                gate.close()
        if not finished:
            return timed_out_result(name, timeout, in_process=True,
                                    stalled_at=pulse.where if idle else None)
        return box["result"]

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
        with self._critical():
            self._current = None
            self._record(name, result, seconds)
            self._write_environment()

    def _record(self, name: str, result: Dict[str, Any], seconds: Optional[float]) -> None:
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

    def _interrupted(self, exc: Interrupted) -> None:
        """Fail the stage that ran, skip every stage not reported yet, keep the files whole."""
        name = self._current
        left = [s.name for s in self.table if s.name not in self.outcome and s.name != name]
        why = f"runner interrupted by {exc}"
        error = {"type": "Interrupted", "message": why,
                 "where": f"stage {name}" if name else (f"before stage {left[0]}"
                                                         if left else None),
                 "hint": "the runner was stopped from outside (a lease ending, a scheduler, "
                         "Ctrl-C, `preflight stop`); `preflight resume RUN` continues it from "
                 "its ledger"}
        if name is not None:
            self._finish(name, {"status": "failed", "facts": {}, "error": error},
                         time.monotonic() - self._t0, started=True)
        elif self.first_error is None:
            self.first_error = {"stage": left[0] if left else self.stage_reached, **error}
            self.outcome["interrupted"] = FAILED
        for stage in left:
            self._finish(stage, {"status": "skipped", "reason": why, "facts": {},
                                 "blocking": True}, None, started=False)

    # -------------------------------------------------------------- environment.json

    def _write_environment(self) -> None:
        doc = {"run": self.spec.run_id, "updated": ev.utc_now(),
               "first_error": self.first_error, "stages": self.record}
        write_json_atomic(os.path.join(self.run_dir, "environment.json"), doc)
