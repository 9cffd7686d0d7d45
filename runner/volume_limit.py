"""The volume's time limit, widened from the measured rate when the items run slower than
the forecast said.

The limit a volume starts with (``volume.time_limit_s``) came from the forecast: twice its
high estimate plus half an hour. A forecast can be wrong; a volume must not be killed at a
limit computed from it while the lease still has room. So the driver, at each progress
report, projects its end from the rate it measures (``elapsed + items left ÷ items per
second``); when that projection, with a margin, passes the limit, the limit is widened to
``MARGIN × projection + GRACE_S``, never past the lease's end (``lease_ends_at``), and a
``volume.limit`` event says so (the watchdog moves the stage's deadline with it; the bot
posts the line in the thread). A limit the manifest set itself (``limit_adapts`` false) is
kept as it is. Standard library only.
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Dict, Optional

MARGIN = 1.5          # the widened limit: this × the projected stage time, + GRACE_S
GRACE_S = 120.0
WIDEN_AT = 0.8        # widen when the projection passes this share of the limit
MIN_DONE = 0.02       # ... once this share of the items (or MIN_ITEMS) is done
MIN_ITEMS = 50


class AdaptiveLimit:
    """The stage's time limit as the driver sees it, and when to widen it."""

    def __init__(self, limit_s: float, *, adapts: bool, lease_ends_at: float = 0.0,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.limit_s = float(limit_s or 0)
        self.adapts = adapts and self.limit_s > 0
        self.lease_ends_at = float(lease_ends_at or 0)
        self.clock, self.wall = clock, wall
        self.began = clock()           # the stage's start, as near as the driver knows it
        self.began_wall = wall()
        self.widened = 0

    @classmethod
    def from_spec(cls, vspec: Any, **kw: Any) -> AdaptiveLimit:
        return cls(float(getattr(vspec, "time_limit_s", 0) or 0),
                   adapts=bool(getattr(vspec, "limit_adapts", False)),
                   lease_ends_at=float(getattr(vspec, "lease_ends_at", 0) or 0), **kw)

    def check(self, done: int, left: int, total: int) -> Optional[Dict[str, Any]]:
        """The ``volume.limit`` event's fields when the limit must widen now, else None.
        ``done``: items recorded in this attempt so far; ``left``: still to record."""
        enough = done >= min(MIN_ITEMS, max(1, total)) or done >= MIN_DONE * total
        if not self.adapts or left <= 0 or not enough:
            return None
        elapsed = self.clock() - self.began
        if elapsed <= 0:
            return None
        rate = done / elapsed
        projected = elapsed + left / rate
        if projected <= WIDEN_AT * self.limit_s:
            return None
        wanted = math.ceil(MARGIN * projected + GRACE_S)
        room = math.floor(self.lease_ends_at - self.began_wall) if self.lease_ends_at \
            else wanted
        new = float(min(wanted, room))
        if new <= self.limit_s:
            return None  # the lease has no more room: the limit stays
        was, self.limit_s = self.limit_s, new
        self.widened += 1
        cut = new < wanted
        return {"limit_s": new, "was_s": was, "items_per_s": round(rate, 3),
                "projected_s": round(projected, 1), "elapsed_s": round(elapsed, 1),
                "left": left, "lease_cut": cut,
                "why": (f"the items run at {rate:.3g}/s: the stage would take about "
                        f"{projected:.0f} s, past {WIDEN_AT:.0%} of its limit of {was:.0f} s "
                        f"(from the forecast); widened to {MARGIN:g} × {projected:.0f} s + "
                        f"{GRACE_S:.0f} s" + (", cut to the lease's end" if cut else ""))}
