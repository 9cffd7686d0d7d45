"""Recorded times are read by one rule (bot/pilot/clock.py's read_time): ISO 8601 with "Z"
or an offset; nothing, or text that is no time, is None. The report, the forecast, the
progress line, the leases and the volume's limits all read them through it."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from bot.messages.progress import epoch, seconds_between
from bot.pilot.clock import read_time
from bot.pilot.leases import LeaseError, normalize_time, parse_time


def test_z_and_an_offset_are_the_same_moment() -> None:
    z, offset = read_time("2026-03-01T09:00:00Z"), read_time("2026-03-01T10:00:00+01:00")
    assert z == offset and z is not None and z.utcoffset() == timedelta(0)
    assert read_time("2026-03-01T09:00:00") == datetime(2026, 3, 1, 9)  # naive stays naive
    for nothing in (None, "", "soon", 42):
        assert read_time(nothing) is None


def test_every_reader_of_a_recorded_time_agrees() -> None:
    assert parse_time("2026-03-01T09:00:00Z") == datetime(2026, 3, 1, 9, tzinfo=timezone.utc)
    assert normalize_time("2026-03-01T10:00:00+01:00", "x") == "2026-03-01T09:00:00+00:00"
    with pytest.raises(LeaseError, match="not an ISO-8601 time"):
        normalize_time("soon", "lease.starts_at")
    assert seconds_between("2026-03-01T09:00:00Z", "2026-03-01T09:00:30+00:00") == 30.0
    assert seconds_between("soon", "2026-03-01T09:00:30Z") is None
    assert epoch("1970-01-01T00:01:00Z") == 60.0 and epoch("soon") is None
