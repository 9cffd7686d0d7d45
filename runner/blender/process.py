"""One Blender process under supervision: started, timed out, its log kept and read.

``run_blender`` starts ``blender -b ...`` with its output going to a log file, waits at
most ``timeout`` seconds, kills it past that, and returns what happened. On Linux the
process is tied to its parent (PR_SET_PDEATHSIG), so a runner killed with SIGKILL never
leaves a render running. ``first_error`` and ``peak_memory_mib`` read Blender's own log.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Sequence

# Blender's own error lines; "Warning: Path '...' not found" is its missing-file report
# (the render setup stops on it). The unfreed-memory report at quit is not an error.
_ERROR = re.compile(r"^\s*(?:Error|ERROR|Fatal error|CUDA error|OptiX error|HIP error|"
                    r"oneAPI error)\b[:\s]|Out of memory|out of GPU memory|"
                    r"^Warning: Path '.*' not found|Segmentation fault|^Writing: .*crash",
                    re.IGNORECASE)
_NOT_ERROR = re.compile(r"^\s*Error: Not freed memory blocks")
# Cycles' status line: "Fra:1 Mem:14.7M (Peak 15.0M) | Time:00:00.52 | Mem:0.41M, Peak:0.41M"
# The second Mem/Peak pair is the render device's memory.
_DEVICE_MEM = re.compile(r"\|\s*Mem:\s*([\d.]+)([KMG])\s*,\s*Peak:\s*([\d.]+)([KMG])")
_HOST_PEAK = re.compile(r"^Fra:\s*-?\d+\s+Mem:\s*[\d.]+[KMG]\s*\(Peak\s+([\d.]+)([KMG])\)")
_SAVED = re.compile(r"^Saved: '(.+)'\s*$")
# The summary after a frame: " Time: 00:01.51 (Saving: 00:01.12)" (hours when long).
_TIME = re.compile(r"^\s*Time: ((?:\d+:)?\d+:[\d.]+) \(Saving: ((?:\d+:)?\d+:[\d.]+)\)")
_UNIT = {"K": 1 / 1024, "M": 1.0, "G": 1024.0}


class BlenderNotFound(Exception):
    """The Blender executable cannot be started."""


@dataclass(frozen=True)
class Outcome:
    returncode: Optional[int]
    timed_out: bool
    seconds: float
    log_path: str

    def log(self) -> str:
        try:
            with open(self.log_path, "rb") as fh:
                return fh.read().decode("utf-8", errors="replace")
        except OSError:
            return ""


def _pdeathsig() -> Optional[Callable[[], None]]:
    """A preexec function tying the child to this thread's life (Linux only)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None

    def tie() -> None:
        prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG

    return tie


def run_blender(argv: Sequence[str], log_path: str, timeout: float,
                cwd: Optional[str] = None, env: Optional[Any] = None) -> Outcome:
    """Run ``argv``; stdout and stderr to ``log_path``; killed after ``timeout`` s."""
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    t0 = time.monotonic()
    with open(log_path, "wb") as log:
        try:
            proc = subprocess.Popen(list(argv), stdin=subprocess.DEVNULL, stdout=log,
                                    stderr=subprocess.STDOUT, cwd=cwd, env=env,
                                    preexec_fn=_pdeathsig(), close_fds=True)
        except OSError as exc:
            raise BlenderNotFound(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc
        # A timer kills Blender at the deadline while this thread blocks in wait(): the
        # end of a frame is seen at once (Popen.wait(timeout) polls, up to 50 ms late).
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            proc.kill()

        timer = threading.Timer(timeout, expire)
        timer.daemon = True
        timer.start()
        try:
            code: Optional[int] = proc.wait()
        except BaseException:
            proc.kill()  # the runner is being stopped: never leave a render behind
            proc.wait()
            raise
        finally:
            timer.cancel()
    if expired.is_set():
        code = None
    return Outcome(code, expired.is_set(), time.monotonic() - t0, log_path)


def first_error(log: str) -> Optional[str]:
    """The first error line of a Blender log, or the exception line of its first Python
    traceback, whichever comes first; None when the log shows no error."""
    lines = log.splitlines()
    for n, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last)"):
            return _traceback_end(lines[n + 1:])
        if _ERROR.search(line) and not _NOT_ERROR.match(line):
            return line.strip()[:500]
    return None


def _traceback_end(rest: List[str]) -> str:
    for line in rest:
        if line and not line.startswith((" ", "\t")):
            return line.strip()[:500]
    return "Python traceback without an exception line"


def peak_memory_mib(log: str) -> Optional[float]:
    """The largest device ``Peak:`` Cycles reported in the log, in MiB."""
    peaks = [float(m.group(3)) * _UNIT[m.group(4)] for m in _DEVICE_MEM.finditer(log)]
    return round(max(peaks), 2) if peaks else None


def host_peak_mib(log: str) -> Optional[float]:
    """The largest ``(Peak ...)`` of Blender's own (host) memory in the log, in MiB."""
    peaks = [float(m.group(1)) * _UNIT[m.group(2)]
             for m in (_HOST_PEAK.match(line) for line in log.splitlines()) if m]
    return round(max(peaks), 2) if peaks else None


def saved_paths(log: str) -> List[str]:
    """Every image Blender says it saved (``Saved: '...'``)."""
    out = []
    for line in log.splitlines():
        m = _SAVED.match(line.strip())
        if m:
            out.append(m.group(1))
    return out


def render_seconds(log: str) -> Optional[float]:
    """Blender's own time for the last frame of the log, without saving the image:
    the render itself, free of process start and scene loading."""
    found = None
    for line in log.splitlines():
        m = _TIME.match(line)
        if m:
            found = _clock(m.group(1)) - _clock(m.group(2))
    return round(max(found, 0.0), 3) if found is not None else None


def _clock(text: str) -> float:
    seconds = 0.0
    for part in text.split(":"):
        seconds = seconds * 60 + float(part)
    return seconds

