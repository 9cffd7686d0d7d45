"""Item events are written as ``item.batch`` lines and read back as item.done events."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from runner.events import (
    ITEM_BATCH,
    ITEM_DONE,
    Event,
    EventFormatError,
    EventWriter,
    expand_items,
    parse_chunk,
    read_events,
)


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(ln) for ln in path.read_text().splitlines()]


def test_items_go_out_as_one_line_before_the_next_event_each_with_its_seq(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    echo = io.StringIO()
    writer = EventWriter(str(path), "r1", echo=echo)
    writer.emit("stage.started", stage="pilot")
    emitted = [writer.emit(ITEM_DONE, id="a", status="accepted", category="x",
                           input_bytes=3, elapsed_s=0.25),
               writer.emit(ITEM_DONE, id="b", status="refused", reason="empty",
                           replayed=True, output={"k": [1, 2]}, stage="pilot")]
    assert len(lines(path)) == 1  # held until the batch's next event
    writer.emit("progress", done=2, total=2)
    writer.close()
    raw = lines(path)
    assert [(e["type"], e["seq"]) for e in raw] == [
        ("stage.started", 1), (ITEM_BATCH, 3), ("progress", 4)]
    assert raw[1]["ts"] == emitted[1].ts  # the line's seq and ts are its last item's
    assert echo.getvalue() == path.read_text()  # echoed as written, after the file
    events, _ = read_events(str(path))
    assert [(e.seq, e.type) for e in events] == [
        (1, "stage.started"), (2, ITEM_DONE), (3, ITEM_DONE), (4, "progress")]
    assert events[1:3] == emitted  # every field back, the extra ones included
    assert events[2].stage == "pilot"


def test_a_long_batch_is_cut_and_close_writes_what_is_held(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path), "r1", max_items=4)
    for n in range(10):
        writer.emit(ITEM_DONE, id=f"i{n}", status="accepted", category="x")
    assert [len(e["items"]) for e in lines(path)] == [4, 4]  # type: ignore[arg-type]
    writer.close()
    assert [len(e["items"]) for e in lines(path)] == [4, 4, 2]  # type: ignore[arg-type]
    events, _ = read_events(str(path))
    assert [e.seq for e in events] == list(range(1, 11))
    assert [e.data["id"] for e in events] == [f"i{n}" for n in range(10)]


def test_a_resumed_writer_numbers_on_after_the_last_batch(tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path), "r1")
    for n in range(3):
        writer.emit(ITEM_DONE, id=f"i{n}", status="accepted", category="x")
    writer.close()
    again = EventWriter.resume(str(path), "r1")
    assert again.emit("progress", done=3, total=3).seq == 4
    again.close()


def test_unexpanded_reading_keeps_the_batch_and_an_older_runners_lines_still_read(
        tmp_path: Path) -> None:
    path = tmp_path / "events.jsonl"
    writer = EventWriter(str(path), "r1")
    writer.emit(ITEM_DONE, id="a", status="accepted", category="x")
    writer.close()
    older = Event(2, ITEM_DONE, "r1", "2026-01-01T00:00:00+00:00",
                  {"id": "b", "status": "accepted", "category": "x"})
    with open(path, "a") as fh:
        fh.write(older.to_line())
    raw, offset = read_events(str(path), expand=False)
    assert [e.type for e in raw] == [ITEM_BATCH, ITEM_DONE]
    assert [e.data["id"] for e in expand_items(raw)] == ["a", "b"]
    assert offset == path.stat().st_size


def batch_line(items: object, seq: int = 2, **more: object) -> bytes:
    obj = {"seq": seq, "type": ITEM_BATCH, "run": "r1", "ts": "t", "items": items,
           "fields": ["seq", "ts", "id", "status", "category", "reason", "elapsed_s",
                      "input_bytes", "extra"], **more}
    return (json.dumps(obj) + "\n").encode()


GOOD = [1, "t", "a", "accepted", "x", None, None, None, None]


@pytest.mark.parametrize(("items", "seq", "what"), [
    ([GOOD, [2, "t", "b"]], 2, "item 1 is not"),
    ([GOOD, [1, *GOOD[1:]]], 1, "item 1 is not"),  # seqs not in order
    ([GOOD, ["2", *GOOD[1:]]], 2, "item 1 is not"),
    ([GOOD, [2, *GOOD[1:-1], "not an object"]], 2, "item 1 is not"),
    ([GOOD], 5, "its last item has seq 1"),
    ([], 2, "non-empty list"),
    ("nope", 2, "non-empty list"),
])
def test_a_malformed_batch_is_named(items: object, seq: int, what: str) -> None:
    with pytest.raises(EventFormatError, match=f"item.batch seq {seq}: .*{what}"):
        parse_chunk(batch_line(items, seq), 0)


def test_a_batch_with_other_fields_is_refused_not_misread() -> None:
    with pytest.raises(EventFormatError, match="expected fields"):
        parse_chunk(batch_line([GOOD], 1, fields=["seq", "ts", "id"]), 0)
