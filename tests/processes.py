"""Process helpers shared by the tests: poll a condition with a deadline, see a pid's state."""

from __future__ import annotations

import time
from typing import Callable


def alive(pid: int) -> bool:
    """True while ``pid`` runs (a zombie, ended but not reaped, counts as ended)."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as fh:
            return not any(line.startswith("State:") and "Z" in line.split()[1] for line in fh)
    except FileNotFoundError:
        return False


def wait_until(condition: Callable[[], object], what: str, deadline_s: float = 90.0) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``deadline_s``."""
    deadline = time.monotonic() + deadline_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)  # polling a condition with a deadline, not waiting for time
