"""Words for time and progress that every transport shows the same way, and the meter
that turns a run's ``progress`` events into items per second and an ETA (no I/O)."""

from __future__ import annotations

from bot.messages.model import Progress
from bot.pilot.clock import read_time

MIN_WINDOW_S = 1.0  # a rate over less than this is noise: none is shown


class ProgressMeter:
    """Items per second since the first ``progress`` this follower saw, and the ETA."""

    def __init__(self) -> None:
        self.first: tuple[float, int] | None = None  # (monotonic time, done)
        self.done = self.total = 0
        self.per_s: float | None = None
        self.pace = ""  # what the runner measured itself (a volume's rates), when it did

    def update(self, done: int, total: int, now: float, pace: str = "") -> None:
        self.pace = pace
        if self.first is None or done < self.first[1]:
            self.first = (now, done)
        self.done, self.total = done, total
        window = now - self.first[0]
        if window >= MIN_WINDOW_S and done > self.first[1]:
            self.per_s = (done - self.first[1]) / window

    def block(self) -> Progress:
        eta = None
        if self.per_s and self.total >= self.done:
            eta = (self.total - self.done) / self.per_s
        return Progress(self.done, self.total, self.pace, self.per_s, eta)


def duration(seconds: float) -> str:
    """``0.4 s``, ``12 s``, ``3 min 05 s``, ``2 h 01 min``."""
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


def progress_words(p: Progress) -> str:
    """``5000/20000 (25%), 812 items/s, ETA 18 s``."""
    pct = 100 * p.done / max(p.total, 1)
    out = f"{p.done}/{p.total} ({pct:.0f}%)"
    if p.pace:  # the runner's own measure wins over the follower's
        return f"{out}, {p.pace}"
    if p.per_s:
        out += f", {p.per_s:.0f} items/s" if p.per_s >= 10 else f", {p.per_s:.2f} items/s"
    if p.eta_s is not None and p.done < p.total:
        out += f", ETA {duration(p.eta_s)}"
    return out


def seconds_between(start: str | None, end: str | None) -> float | None:
    """Seconds between two ISO-8601 times (the events' ``ts``), or None."""
    began, ended = read_time(start), read_time(end)
    if began is None or ended is None:
        return None
    return max(0.0, (ended - began).total_seconds())


def epoch(stamp: str | None) -> float | None:
    moment = read_time(stamp)
    return moment.timestamp() if moment is not None else None
