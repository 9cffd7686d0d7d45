"""When a copy to or from a node has failed: no fixed wall limit, a rule on its progress.

A copy of a run to its nodes (the upload's archive stream) or of the results back (the
fetch) fails when one of its transfers moved no byte for ``TransferLimits.stall_s``
(``PREFLIGHT_TRANSFER_STALL_S``, 120 s), and otherwise runs as long as bytes move, up to
a ceiling derived from the bytes and files to move: ``fixed_s`` (the caller's, for the
steps that move no bytes: a session, the node hashing its copy, the card proof's files)
plus the bytes to move at ``floor_bytes_per_s`` (``PREFLIGHT_TRANSFER_FLOOR_BYTES_PER_S``,
1 MiB/s) plus ``per_file_s`` for each file (a million small files cost their opens and
headers, not their bytes). A 200 GB upload at 50 MB/s takes its 4,000 s and is not
failed; one that stops moving is failed two minutes later, not after a quarter of an hour.

Pure bookkeeping (a clock is injected): ``bot/nodes/ssh/dispatcher.py`` feeds the meters from
its transfers and asks ``TransferWatch.verdict`` while it waits for them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import dataclass

MIB = 1 << 20


@dataclass(frozen=True)
class TransferLimits:
    """``stall_s``: the most a transfer may go without moving a byte; ``floor_bytes_per_s``:
    the slowest rate a healthy copy is expected to keep, over its whole length."""

    stall_s: float = 120.0
    floor_bytes_per_s: float = float(MIB)
    per_file_s: float = 0.01

    def ceiling(self, fixed_s: float, total_bytes: int, files: int = 0) -> float:
        """The longest a copy of ``total_bytes`` in ``files`` files may take in all."""
        return fixed_s + total_bytes / self.floor_bytes_per_s + files * self.per_file_s


class Meter:
    """One transfer's progress (a node, a phase): the bytes it has to move, the bytes
    moved, and when it last moved any. Fed from any thread."""

    def __init__(self, where: str, phase: str, clock: Callable[[], float]) -> None:
        self.where, self.phase, self.clock = where, phase, clock
        self.total = self.done = self.files = 0
        self.active = False
        self.last = clock()
        self._lock = threading.Lock()

    def start(self, total: int = 0) -> None:
        """The transfer begins (its idle time counts from now), ``total`` bytes to move."""
        with self._lock:
            self.total, self.active, self.last = self.total + total, True, self.clock()

    def expect(self, more: int, files: int = 0) -> None:
        """``more`` bytes (in ``files`` files) found to move (a fetch learns its sizes as
        they arrive)."""
        with self._lock:
            self.total += more
            self.files += files

    def moved(self, n: int = 0) -> None:
        """``n`` bytes moved (0: a sign of life that moves none, such as a listing)."""
        with self._lock:
            self.done += n
            self.last = self.clock()

    def end(self) -> None:
        """Its bytes are through: waiting for the node's answer is no stall."""
        with self._lock:
            self.active = False


class TransferWatch:
    """The transfers of one call (one node's, or several nodes' at once), judged by one
    rule: ``verdict`` says why the call must stop, or None while it may go on."""

    def __init__(self, limits: TransferLimits, fixed_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limits, self.fixed_s, self.clock = limits, fixed_s, clock
        self.t0 = clock()
        self.meters: list[Meter] = []
        self.stalled: Meter | None = None  # the transfer the last verdict found stalled

    def meter(self, where: str, phase: str) -> Meter:
        meter = Meter(where, phase, self.clock)
        self.meters.append(meter)
        return meter

    @property
    def total(self) -> int:
        return sum(m.total for m in self.meters)

    @property
    def files(self) -> int:
        return sum(m.files for m in self.meters)

    def ceiling(self) -> float:
        return self.limits.ceiling(self.fixed_s, self.total, self.files)

    def verdict(self) -> str | None:
        now = self.clock()
        for m in self.meters:
            idle = now - m.last
            if m.active and idle > self.limits.stall_s:
                self.stalled = m
                return (f"{m.where}: the {m.phase} stalled: no byte moved for {idle:.0f} s "
                        f"({_size(m.done)} of {_size(m.total)} moved; the stall limit is "
                        f"{self.limits.stall_s:g} s, PREFLIGHT_TRANSFER_STALL_S). Check the "
                        "node's disk and the network, then try again")
        elapsed, ceiling = now - self.t0, self.ceiling()
        if elapsed > ceiling:
            moving = "; ".join(f"{m.where} {m.phase}: {_size(m.done)} of {_size(m.total)}"
                               for m in self.meters) or "no transfer began"
            files = (f" + {self.files} files at {self.limits.per_file_s:g} s each"
                     if self.files else "")
            return (f"the copy took more than {ceiling:.0f} s, its ceiling "
                    f"({self.fixed_s:.0f} s + {_size(self.total)} at the floor rate of "
                    f"{_size(int(self.limits.floor_bytes_per_s))}/s{files}, "
                    f"PREFLIGHT_TRANSFER_FLOOR_BYTES_PER_S): {moving}")
        return None


def _size(n: int) -> str:
    """Bytes as people read them, the exact count kept below 1 MiB."""
    if n < MIB:
        return f"{n} bytes"
    if n < 1 << 30:
        return f"{n / MIB:.1f} MiB"
    return f"{n / (1 << 30):.2f} GiB"


_METER: ContextVar[Meter | None] = ContextVar("preflight_transfer_meter", default=None)


def current_meter() -> Meter | None:
    """The meter of the transfer the running task belongs to (None: nobody watches)."""
    return _METER.get()


def use_meter(meter: Meter | None) -> None:
    """Make ``meter`` the current task's (tasks and threads it starts after this inherit
    it: asyncio copies the context)."""
    _METER.set(meter)
