"""Every list in an event is capped (the full list in a file of the run); a reader by
windows grows its window for a long line and skips one over its most, never waiting."""

from __future__ import annotations

import json
from pathlib import Path

from runner.events import (
    EVIDENCE,
    LIST_CAP,
    STAGE_FAILED,
    EventWriter,
    list_total,
    parse_chunk,
    read_complete,
    read_events,
)


def test_an_event_with_a_10000_item_list_is_written_capped_with_the_full_list_in_its_file(
        tmp_path: Path) -> None:
    problems = [f"out/{n}.json: missing" for n in range(10_000)]
    writer = EventWriter(str(tmp_path / "events.jsonl"), "r1")
    writer.emit("run.started")
    event = writer.emit(EVIDENCE, files=10_000, problems=problems, verified=False)
    writer.close()
    assert len(problems) == 10_000  # the caller's list is not changed
    line = (tmp_path / "events.jsonl").read_text(encoding="utf-8").splitlines()[-1]
    assert len(line) < 20_000
    (written,), _ = read_events(str(tmp_path / "events.jsonl"), len(
        (tmp_path / "events.jsonl").read_bytes()) - len(line) - 1)
    assert written.data == event.data
    assert written.data["problems"] == problems[:LIST_CAP]
    assert written.data["problems_total"] == 10_000 == list_total(written.data, "problems")
    assert written.data["problems_file"] == "event-lists/2-problems.json"
    full = json.loads((tmp_path / written.data["problems_file"]).read_text(encoding="utf-8"))
    assert full == {"list": problems}
    assert [p.name for p in (tmp_path / "event-lists").iterdir()] == ["2-problems.json"]


def test_a_list_inside_an_object_is_capped_and_a_short_list_is_left_alone(
        tmp_path: Path) -> None:
    writer = EventWriter(str(tmp_path / "events.jsonl"), "r1")
    event = writer.emit(STAGE_FAILED, stage="evidence", cards=["0", "1"],
                        facts={"missing": list(range(LIST_CAP + 1)), "ok": [1]})
    writer.close()
    assert event.data["cards"] == ["0", "1"] and "cards_total" not in event.data
    facts = event.data["facts"]
    assert facts["missing"] == list(range(LIST_CAP))
    assert facts["missing_total"] == LIST_CAP + 1 == list_total(facts, "missing")
    assert facts["missing_file"] == "event-lists/1-facts.missing.json"
    assert json.loads((tmp_path / facts["missing_file"]).read_text())["list"][-1] == LIST_CAP
    assert facts["ok"] == [1] and list_total(facts, "ok") == 1


def test_a_list_file_that_cannot_be_written_still_caps_the_event_and_says_why(
        tmp_path: Path) -> None:
    (tmp_path / "event-lists").write_text("a file where the folder goes")
    writer = EventWriter(str(tmp_path / "events.jsonl"), "r1")
    event = writer.emit(EVIDENCE, problems=list(range(LIST_CAP * 2)))
    writer.close()
    assert len(event.data["problems"]) == LIST_CAP
    assert event.data["problems_file"] is None
    assert event.data["problems_file_error"]


def _reader(data: bytes) -> tuple[list[tuple[int, int]], object]:
    reads: list[tuple[int, int]] = []

    def read(at: int, size: int) -> bytes:
        reads.append((at, size))
        return data[at:at + size]
    return reads, read


def _line(seq: int, **data: object) -> bytes:
    return (json.dumps({"seq": seq, "type": "note", "run": "r", "ts": "t", **data})
            + "\n").encode()


def test_a_line_longer_than_the_window_grows_it_and_the_events_after_it_are_read() -> None:
    data = _line(1, big="x" * 5000) + _line(2)
    reads, read = _reader(data)
    chunk, start, skipped = read_complete(read, 0, window=1024, most=64 << 10)
    events, offset = parse_chunk(chunk, start)
    assert [e.seq for e in events] == [1, 2] and offset == len(data) and not skipped
    assert [size for _, size in reads] == [1024, 2048, 4096, 8192]


def test_a_line_over_the_most_is_skipped_kept_whole_and_named_by_offset() -> None:
    head = _line(1)
    data = head + _line(2, big="x" * 10_000) + _line(3) + _line(4)
    _, read = _reader(data)
    kept = bytearray(len(head))
    kept[:] = head

    def keep(at: int, piece: bytes) -> None:
        kept[at:at + len(piece)] = piece
    chunk, start, skipped = read_complete(read, len(head), window=512, most=2048, keep=keep)
    assert skipped == [(len(head), len(_line(2, big="x" * 10_000)))]
    events, offset = parse_chunk(chunk, start)
    assert [e.seq for e in events] == [3, 4] and offset == len(data)
    assert bytes(kept) == data[:start]  # the skipped line is in the copy, whole


def test_a_long_line_not_yet_ended_is_waited_for_not_skipped() -> None:
    data = _line(1) + b'{"seq": 2, "big": "' + b"x" * 10_000
    _, read = _reader(data)
    chunk, start, skipped = read_complete(read, len(_line(1)), window=512, most=2048)
    assert (chunk, start, skipped) == (b"", len(_line(1)), [])
