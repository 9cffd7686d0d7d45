"""One bot process at a time ends a run on its nodes: stops its runner and Ray, fetches
its results, records its outcome.

Two bot processes may end the same run at once: a `preflight follow` (or the Slack bot)
that sees its runner finish, and a `preflight stop` that stopped it and follows it to its
end. Both used to stop the volume's Ray on every node and fetch the results into the same
staging folder: one failed (``FileNotFoundError … preflight.pgid``, ``File exists:
'…/.fetch'``) and the local run directory was left without the ledger and the events.
``end_lock`` is an advisory lock (``flock``) on ``<run dir>/.end.lock``, which names its
holder (pid, host, command, what it does, since when): the other process says whom it
waits for, waits, and then finds the run ended. The kernel releases the lock of a process
that dies, so a crashed holder never blocks the run.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from bot.pilot.clock import now_utc

LOCK_FILE = ".end.lock"

log = logging.getLogger(__name__)


@contextmanager
def end_lock(run_dir: Path, run_id: str, doing: str,
             waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    """Hold the run's end lock while ``doing``; ``waiting`` hears, once, whom this process
    waits for (default: a warning in the log). A run directory that cannot hold the file
    (gone, unwritable) is ended without the lock, with a warning."""
    try:
        fd = os.open(run_dir / LOCK_FILE,
                     os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as exc:
        log.warning("run %s: no end lock in %s (%s); ending it without one", run_id,
                    run_dir, exc)
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            (waiting or log.warning)(f"run {run_id}: another bot process is ending it "
                                     f"({_holder(fd)}); waiting for it")
            fcntl.flock(fd, fcntl.LOCK_EX)
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps({
            "pid": os.getpid(), "host": socket.gethostname(), "doing": doing,
            "command": " ".join(os.path.basename(a) if i == 0 else a
                                for i, a in enumerate(sys.argv))[:200],
            "since": now_utc()}).encode(), 0)
        yield
    finally:
        try:
            os.ftruncate(fd, 0)
        except OSError:
            pass
        os.close(fd)  # and with it the lock


def _holder(fd: int) -> str:
    """Who holds the lock, as it wrote itself down (a holder that has not written yet, or
    an unreadable record: "holder unknown")."""
    try:
        data = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        data = {}
    if not isinstance(data, dict) or "pid" not in data:
        return "holder unknown"
    return (f"pid {data.get('pid')} on {data.get('host')}, `{data.get('command')}`, "
            f"{data.get('doing')} since {data.get('since')}")
