"""Run ids and the recorded time: both from the UTC clock, nothing else read; and the one
rule by which a recorded time (the store's, an event's ``ts``, a lease's) is read back."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any


def new_run_id(name: str, attempt: int, kind: str = "pilot") -> str:
    """Time-sortable and unique: ``20261202T140501123Z-pilote-demo-a1``."""
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    return f"{stamp}-{name}-{'v' if kind == 'volume' else 'a'}{attempt}"


def now_utc() -> str:
    """Now, as the store records times (ISO 8601, seconds, UTC)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def read_time(value: Any) -> datetime | None:
    """A recorded time (ISO 8601; "Z" or an offset, else naive as written) as a datetime;
    None when there is none or the text is not a time."""
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return None
