"""The watchdog: stages that can hang run in one persistent worker process.

The parent (``python -m runner``) starts the worker once; torch is imported there once and
reused by every later stage. Messages are JSON lines: commands go to the worker's stdin,
results and relayed events come back on a dedicated pipe (the worker's stdout is sent to
the parent's stderr, so a stage that prints cannot corrupt the protocol). The parent alone
owns the EventWriter; events a stage emits in the worker are relayed and written there, so
``seq`` stays single-writer.

A stage past its timeout gets the worker's whole process group killed (SIGKILL) and fails
with "timed out after N s"; the next stage that needs the worker starts a fresh one. The
worker dies with its parent: it exits on stdin EOF (a thread watches it even while a stage
runs) and, on Linux, asks the kernel for SIGKILL when the parent dies (PR_SET_PDEATHSIG).
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.stage import StageFailure, StageSkipped

Result = Dict[str, Any]
_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from runner.watchdog import worker_main; worker_main(int(sys.argv[2]))")


def _interpreter_flags() -> List[str]:
    """Flags that make the worker's interpreter behave like the parent's."""
    flags = []
    if sys.flags.isolated:
        flags.append("-I")
    else:
        if sys.flags.ignore_environment:
            flags.append("-E")
        if sys.flags.no_user_site:
            flags.append("-s")
    if sys.flags.no_site:
        flags.append("-S")
    return flags


class Worker:
    """Parent-side handle on the worker process."""

    def __init__(self, spec_path: str, run_dir: str, resume: bool) -> None:
        self.spec_path = os.path.abspath(spec_path)
        self.run_dir = run_dir
        self.resume = resume
        self.proc: Optional[subprocess.Popen[bytes]] = None
        self._messages: queue.Queue[Optional[Result]] = queue.Queue()
        self._reader: Optional[threading.Thread] = None
        self.starts = 0

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> None:
        """Start the worker process (no-op when one is running)."""
        if self.alive:
            return
        self.stop()
        read_fd, write_fd = os.pipe()
        path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
        argv = [sys.executable, *_interpreter_flags(), "-c", _BOOT, json.dumps(path),
                str(write_fd)]
        try:
            self.proc = subprocess.Popen(
                argv, stdin=subprocess.PIPE, stdout=sys.stderr.fileno(), pass_fds=(write_fd,),
                start_new_session=True, close_fds=True)
        finally:
            os.close(write_fd)
        self.starts += 1
        self._messages = queue.Queue()
        self._reader = threading.Thread(target=self._read, args=(read_fd, self._messages),
                                        name="watchdog-reader", daemon=True)
        self._reader.start()
        self._send({"op": "init", "spec_path": self.spec_path, "run_dir": self.run_dir,
                    "resume": self.resume})

    @staticmethod
    def _read(fd: int, messages: queue.Queue[Optional[Result]]) -> None:
        with os.fdopen(fd, "rb") as fh:
            for raw in fh:
                try:
                    messages.put(json.loads(raw.decode("utf-8")))
                except ValueError:
                    continue
        messages.put(None)

    def _send(self, message: Result) -> bool:
        assert self.proc is not None and self.proc.stdin is not None
        try:
            self.proc.stdin.write((json.dumps(message) + "\n").encode("utf-8"))
            self.proc.stdin.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    def run_stage(self, name: str, facts: Dict[str, Any], timeout: float,
                  emit: Callable[..., Any], idle: bool = False) -> Result:
        """Run one stage in the worker; relay its events through ``emit``.

        Returns ``{"status": "passed"|"failed"|"skipped", "facts", "error"?, "reason"?,
        "blocking"?}``. A timeout or a dead worker is a failed result, never an exception.
        ``idle``: the stage is judged by its progress: ``timeout`` is the longest it may go
        without an event or a ``ctx.beat``.
        """
        self.start()
        if not self._send({"op": "run", "stage": name, "facts": facts}):
            return self._died(name)
        began = time.monotonic()
        deadline = began + timeout
        where: Optional[str] = "its start" if idle else None
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return self._timed_out(name, timeout, where)
            try:
                message = self._messages.get(timeout=remaining)
            except queue.Empty:
                return self._timed_out(name, timeout, where)
            if message is None:
                return self._died(name)
            if idle and message.get("kind") in ("event", "beat"):
                deadline, where = time.monotonic() + timeout, message.get("where") or where
            if message.get("kind") == "event":
                emit(message["type"], **message.get("data", {}))
                widened = _widened(message, timeout)
                if widened is not None:  # the volume's driver widened its time limit
                    timeout, deadline = widened, began + widened
            elif message.get("kind") == "result":
                return message

    def _timed_out(self, name: str, timeout: float, where: Optional[str] = None) -> Result:
        self.kill()
        return timed_out_result(name, timeout, stalled_at=where)

    def _died(self, name: str) -> Result:
        code = self.proc.wait() if self.proc is not None else None
        self.kill()
        how = (f"killed by signal {signal.Signals(-code).name}" if code is not None and code < 0
               else f"exited with code {code}")
        return {"status": "failed", "facts": {}, "error": {
            "type": "WorkerDied",
            "message": f"the worker process running stage {name} {how}",
            "where": f"stage {name}",
            "hint": ("a crash inside native code (driver, extension) or the out-of-memory "
                     "killer; see the runner's stderr and dmesg"),
        }}

    def kill(self) -> None:
        """Kill the worker's whole process group, reap it, and wait (2 s at most) until no
        process of the group is left: a SIGKILLed grandchild (a user's check, a compiler)
        dies when the kernel next runs it, which on a loaded node is after our wait()."""
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        proc.wait()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            try:  # again: a fork that raced the first signal is killed too
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.01)
        self._close_pipes()

    def stop(self, grace: float = 5.0) -> None:
        """Ask the worker to exit; kill it if it does not within ``grace`` seconds."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            self._send({"op": "exit"})
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill()

    def _close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdin is not None:
            try:
                self.proc.stdin.close()
            except OSError:
                pass
        if self._reader is not None:
            self._reader.join(timeout=5)
            self._reader = None
        self.proc = None


def _widened(message: Result, timeout: float) -> Optional[float]:
    """The stage's new time limit when ``message`` is a ``volume.limit`` event that widens
    it (runner/volume_limit.py); never a shorter one."""
    if message.get("type") != "volume.limit":
        return None
    value = (message.get("data") or {}).get("limit_s")
    if isinstance(value, (int, float)) and not isinstance(value, bool) and value > timeout:
        return float(value)
    return None


def timed_out_result(name: str, timeout: float, in_process: bool = False,
                     stalled_at: Optional[str] = None) -> Result:
    """The failed result of a stage past its timeout (worker killed, or thread abandoned);
    ``stalled_at``: a stage judged by its progress made none for ``timeout`` s after it."""
    if in_process:
        cause = ("a hung file system call: a network mount under the run directory, the "
                 "project or results.copy_to; the stuck call is abandoned, it cannot be killed")
    else:
        cause = "a hung driver call, a deadlocked extension or a slow user check"
    if stalled_at is not None:
        return {"status": "failed", "facts": {"stalled_at": stalled_at}, "error": {
            "type": "Timeout",
            "message": f"stage {name} made no progress for {timeout:g} s; it stopped at "
                       f"{stalled_at}",
            "where": f"stage {name}: {stalled_at}",
            "hint": (f"the {name} stage stopped moving ({cause}); raise "
                     f"diagnostics.timeouts.{name} (the longest it may go without "
                     "progress) if it is only slow"),
        }}
    return {"status": "failed", "facts": {}, "error": {
        "type": "Timeout",
        "message": f"stage {name} timed out after {timeout:g} s",
        "where": f"stage {name}",
        "hint": (f"the {name} stage did not finish in time ({cause}); raise "
                 f"diagnostics.timeouts.{name} if it is only slow"),
    }}


# ---------------------------------------------------------------- worker side

def _die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
    if os.getppid() != parent:
        os._exit(1)  # the parent died before prctl took effect


def _watch_stdin(commands: queue.Queue[Result]) -> None:
    for raw in sys.stdin.buffer:
        try:
            commands.put(json.loads(raw.decode("utf-8")))
        except ValueError:
            continue
    os._exit(0)  # parent gone (or closed our stdin): never outlive it


class _Channel:
    def __init__(self, fd: int) -> None:
        self._fh = os.fdopen(fd, "w", encoding="utf-8")
        self._lock = threading.Lock()

    def send(self, message: Result) -> None:
        line = json.dumps(message, default=str, allow_nan=False) + "\n"
        with self._lock:
            self._fh.write(line)
            self._fh.flush()


def _safe(value: Any) -> Any:
    """Facts as strict JSON values: NaN/inf become strings, unknown objects their str()."""
    if isinstance(value, float) and (value != value or value in (float("inf"), -float("inf"))):
        return str(value)
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, dict):
        return {str(k): _safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_safe(v) for v in value]
    return str(value)


def run_stage_here(name: str, ctx: Any, target: Optional[str] = None) -> Result:
    """Run one stage in this process and describe the outcome (shared with the parent);
    ``target`` ("module:function", the ladder's own table row) else the stage table's."""
    from runner.stage import STAGES_BY_NAME, stage_target
    from runner.stages.hints import describe_error

    target = target or stage_target(STAGES_BY_NAME[name], ctx.spec)
    try:
        func = _resolve(target)
        facts = func(ctx) or {}
        return {"status": "passed", "facts": _safe(facts)}
    except StageSkipped as exc:
        return {"status": "skipped", "reason": exc.reason, "facts": _safe(exc.facts),
                "blocking": exc.blocking}
    except StageFailure as exc:
        return {"status": "failed", "facts": _safe(exc.facts), "error": describe_error(exc)}
    except Exception as exc:  # noqa: BLE001 - any stage crash is that stage's failure
        return {"status": "failed", "facts": {}, "error": describe_error(exc)}


def _resolve(target: str) -> Callable[..., Any]:
    import importlib

    module_name, func_name = target.split(":")
    return getattr(importlib.import_module(module_name), func_name)  # type: ignore[no-any-return]


def worker_main(channel_fd: int) -> None:
    """Entry point of the worker process."""
    parent = os.getppid()
    _die_with_parent(parent)
    os.dup2(2, 1)  # keep stray prints of stages out of the parent's event stream
    sys.stdout = sys.stderr
    from runner.spec import load_spec
    from runner.stage import StageContext

    channel = _Channel(channel_fd)
    commands: queue.Queue[Result] = queue.Queue()
    threading.Thread(target=_watch_stdin, args=(commands,), daemon=True).start()
    init = commands.get()
    spec = load_spec(init["spec_path"])

    def emit(etype: str, **data: Any) -> None:
        channel.send({"kind": "event", "type": etype, "data": _safe(data)})

    last_beat = [0.0]

    def beat(where: str) -> None:  # at most 10 a second reach the parent
        now = time.monotonic()
        if now - last_beat[0] >= 0.1:
            last_beat[0] = now
            channel.send({"kind": "beat", "where": str(where)[:300]})

    while True:
        command = commands.get()
        if command.get("op") != "run":
            break
        ctx = StageContext(spec=spec, run_dir=init["run_dir"], resume=init["resume"],
                           facts=command.get("facts") or {}, emit=emit, beat=beat)
        result = run_stage_here(command["stage"], ctx)
        channel.send({"kind": "result", **result})
    os._exit(0)


def resolve_stage(target: str) -> Tuple[bool, str]:
    """Whether a stage's module exists (without importing it)."""
    import importlib.util

    module_name = target.split(":")[0]
    try:
        return importlib.util.find_spec(module_name) is not None, module_name
    except (ImportError, ValueError):
        return False, module_name
