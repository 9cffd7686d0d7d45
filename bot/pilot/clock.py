"""Run ids and the recorded time: both from the UTC clock, nothing else read."""

from __future__ import annotations

from datetime import datetime, timezone


def new_run_id(name: str, attempt: int, kind: str = "pilot") -> str:
    """Time-sortable and unique: ``20261202T140501123Z-pilote-demo-a1``."""
    now = datetime.now(timezone.utc)
    stamp = now.strftime("%Y%m%dT%H%M%S") + f"{now.microsecond // 1000:03d}Z"
    return f"{stamp}-{name}-{'v' if kind == 'volume' else 'a'}{attempt}"


def now_utc() -> str:
    """Now, as the store records times (ISO 8601, seconds, UTC)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")
