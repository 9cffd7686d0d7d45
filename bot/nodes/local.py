"""The local dispatcher: the runner as a detached process on the bot host.

A dispatcher starts ``python -m runner SPEC --run-dir DIR`` somewhere and hands back the
events it appends to ``events.jsonl``, read by byte offset so a follower (or a restarted
bot) resumes exactly where it stopped. The runner is started detached (its own process
session, output to ``runner.log``), so stopping the bot does not stop the pilot.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import threading
import time
from pathlib import Path

import runner
from bot.dispatch.base import LOG_TAIL_BYTES, RunHandle, events_error, read_tail
from bot.dispatch.inputs_check import recheck_inputs
from bot.dispatch.plan import plan_of
from bot.errors import DispatchError
from bot.node_programs.launcher import running
from runner.events import Event, EventFormatError, read_events
from runner.files import write_text_atomic

RUNNER_ROOT = Path(runner.__file__).resolve().parent.parent
KIND = "local"


class LocalDispatcher:
    """Runs the runner as a detached local process with the given interpreter."""

    def __init__(self, python: str, *, env: dict[str, str]) -> None:
        """``env``: what the runner inherits (``Settings.runner_env``: the entry point's
        environment minus Slack secrets; the dispatcher never reads the environment)."""
        self.python = python
        self.env = env
        self._procs: dict[str, subprocess.Popen[bytes]] = {}

    def python_for(self, handle: RunHandle) -> str:
        """The interpreter the manifest names (node.python), found on PATH; Preflight's own
        (``self.python``) only when the manifest names none, which the plan says."""
        named = (handle.node or {}).get("python")
        if not named:
            return self.python
        found = shutil.which(str(named))
        if found is None:
            raise DispatchError(f"node.python {named!r}: no such interpreter on this host "
                                "(not an executable path, not found on PATH); name the "
                                "interpreter your project runs with")
        return found

    def start(self, handle: RunHandle) -> int | None:
        # the inputs are still those checked (the spec of the run's launch plan)
        recheck_inputs(handle.run_dir, plan_of(handle).spec())
        python = self.python_for(handle)
        argv = [python, "-m", "runner", str(handle.spec_path),
                "--run-dir", str(handle.run_dir)]
        if handle.resume:
            argv.append("--resume")
        env = dict(self.env)
        # The runner package travels by path: the node's interpreter need not have us installed.
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (str(RUNNER_ROOT), str(handle.project_dir), env.get("PYTHONPATH", "")) if p)
        env.setdefault("PYTHONUNBUFFERED", "1")
        try:
            # never through a link the run's code left there (a resume appends to it)
            log = os.fdopen(os.open(handle.run_dir / "runner.log", os.O_WRONLY | os.O_CREAT
                                    | os.O_APPEND | os.O_NOFOLLOW, 0o644), "ab")
        except OSError as exc:
            raise DispatchError(f"cannot write {handle.run_dir / 'runner.log'}: {exc}") from exc
        try:
            proc = subprocess.Popen(argv, cwd=str(handle.project_dir), stdin=subprocess.DEVNULL,
                                    stdout=log, stderr=subprocess.STDOUT, env=env,
                                    start_new_session=True)
        except OSError as exc:
            raise DispatchError(
                f"cannot start the runner with {python!r}: {exc.strerror or exc}; "
                "set PREFLIGHT_RUNNER_PYTHON or node.python to a working interpreter") from exc
        finally:
            log.close()
        self._procs[handle.run_id] = proc
        # Reap the runner as soon as it ends, whoever is (or is not) following it.
        threading.Thread(target=proc.wait, name=f"reap-{handle.run_id}", daemon=True).start()
        write_text_atomic(handle.run_dir / "runner.pid", f"{proc.pid}\n")
        return proc.pid

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        path = handle.run_dir / "events.jsonl"
        try:
            return read_events(str(path), offset, expand=False)
        except EventFormatError as exc:
            raise events_error(handle, str(path), exc) from exc

    def is_alive(self, handle: RunHandle) -> bool:
        proc = self._procs.get(handle.run_id)
        if proc is not None:
            return proc.poll() is None
        pid = handle.pid or _pid_file(handle.run_dir)
        if pid is None:
            return False
        return running(pid) is not None

    def clean_up(self, handle: RunHandle) -> list[str]:
        """Nothing runs beside a local runner."""
        return []

    def exit_code(self, handle: RunHandle) -> int | None:
        proc = self._procs.get(handle.run_id)
        return proc.poll() if proc is not None else None

    def fetch_results(self, handle: RunHandle) -> Path | None:
        return None  # the runner's own copy is already on this host

    def log_tail(self, handle: RunHandle, limit: int = LOG_TAIL_BYTES) -> str:
        return read_tail(handle.run_dir / "runner.log", limit)

    def close(self) -> None:
        """Nothing is held open: each runner is its own detached process."""

    def stop(self, handle: RunHandle, grace_s: float = 10.0) -> None:
        """SIGTERM to the runner's process group (it writes run.finished and exits), then
        SIGKILL to whatever of the group is left after ``grace_s``; also a runner this
        process did not start (its pid from the store or runner.pid)."""
        proc = self._procs.get(handle.run_id)
        pid = proc.pid if proc is not None else (handle.pid or _pid_file(handle.run_dir))
        if pid is None:
            return
        try:
            os.killpg(pid, signal.SIGTERM)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and _group_alive(pid):
            if proc is not None:
                try:
                    proc.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            else:
                threading.Event().wait(0.1)
        try:
            os.killpg(pid, signal.SIGKILL)  # the runner's children (worker, user code)
        except (ProcessLookupError, PermissionError):
            pass
        if proc is not None:
            proc.wait(timeout=10)


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return running(pgid) is not None or _has_other_members(pgid)


def _has_other_members(pgid: int) -> bool:
    """Whether a process other than the (zombie) leader is still in the group."""
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != pgid]
    except OSError:
        return True
    for pid in pids:
        try:
            if os.getpgid(pid) == pgid:
                return True
        except OSError:
            continue
    return False


def _pid_file(run_dir: Path) -> int | None:
    """The pid the dispatcher wrote when it started the runner (a bot that died before
    storing it in SQLite still left it here)."""
    try:
        return int((run_dir / "runner.pid").read_text().strip())
    except (OSError, ValueError):
        return None
