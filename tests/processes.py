"""Process helpers shared by the tests: poll a condition with a deadline, see a pid's state."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, ended but not reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


@dataclass(frozen=True)
class Proc:
    pid: int
    pgid: int
    cmdline: bytes  # NUL-separated, as /proc has it (Ray's agents rename theirs ray::...)


def live_processes() -> Iterator[Proc]:
    """Every process of this machine that is running (zombies and the dead left out)."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b") ", 1)[-1][:1]
            with open(f"/proc/{name}/cmdline", "rb") as fh:
                cmdline = fh.read()
            pgid = os.getpgid(int(name))
        except OSError:  # ended while we looked
            continue
        if state not in (b"Z", b"X"):
            yield Proc(int(name), pgid, cmdline)


def wait_until(condition: Callable[[], object], what: str, deadline_s: float = 90.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline, not waiting for time


def _stat(pid: int) -> tuple[int, int, str] | None:
    """(ppid, pgid, start time) of a running ``pid``; None once it ended (or a zombie)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] in ("Z", "X") else (int(fields[1]), int(fields[2]), fields[19])


def family(roots: set[int], groups: set[int]) -> dict[int, str]:
    """Every running process that is one of ``roots``, in one of the process ``groups``, or
    a descendant of such (Ray's actors take a group of their own under their raylet):
    pid -> start time, so ``still_running`` never mistakes a reused pid for it."""
    table = {int(n): s for n in os.listdir("/proc") if n.isdigit()
             if (s := _stat(int(n))) is not None}
    members = {pid for pid, (_, pgid, _) in table.items() if pid in roots or pgid in groups}
    grown = True
    while grown:
        more = {pid for pid, (ppid, _, _) in table.items() if ppid in members} - members
        members |= more
        grown = bool(more)
    return {pid: table[pid][2] for pid in members}


def still_running(snapshot: dict[int, str]) -> list[int]:
    """The processes of a ``family`` snapshot that still run (same pid, same start time)."""
    return [pid for pid, start in snapshot.items()
            if (s := _stat(pid)) is not None and s[2] == start]
