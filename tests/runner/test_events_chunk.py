"""parse_chunk decodes a whole chunk at once, and still names a bad line."""

from __future__ import annotations

import pytest

from runner.events import Event, EventFormatError, parse_chunk


def line(seq: int, **data: object) -> bytes:
    return Event(seq, "item.done", "r", "2026-01-01T00:00:00+00:00", dict(data)).to_line().encode()


def test_a_chunk_is_parsed_in_one_go_and_a_partial_last_line_is_left() -> None:
    chunk = line(1, id="a") + line(2, id="b") + b'{"seq": 3, "ty'
    events, offset = parse_chunk(chunk, 100)
    assert [(e.seq, e.data["id"]) for e in events] == [(1, "a"), (2, "b")]
    assert offset == 100 + len(line(1, id="a") + line(2, id="b"))


def test_a_bad_line_is_named_even_when_the_lines_would_join_into_valid_json() -> None:
    with pytest.raises(EventFormatError, match="not JSON"):
        parse_chunk(line(1, id="a") + b'{"seq": 2, "x": [1\n2]}\n', 0)
    with pytest.raises(EventFormatError, match="missing field"):
        parse_chunk(line(1, id="a") + b'{"seq": 2}\n', 0)
