from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from runner.ledger import Anomaly, Ledger, LedgerError, Row


def test_rows_survive_reopen_and_attempts_are_counted(tmp_path: Path) -> None:
    path = str(tmp_path / "ledger.sqlite")
    with Ledger.open(path, new_attempt=True) as led:
        led.record([Row("b", "accepted", category="x"), Row("a", "refused", reason="bad")],
                   [Anomaly("invented", "zz", "not among the inputs")])
        assert led.attempt == 1
    with Ledger.open(path, new_attempt=True) as led:
        assert led.attempt == 2
        assert led.done_ids() == {"a", "b"}
        assert [r.id for r in led.rows()] == ["a", "b"]
        assert led.rows().__next__().to_result() == {"id": "a", "status": "refused",
                                                      "reason": "bad"}
        assert led.anomalies() == [Anomaly("invented", "zz", "not among the inputs")]
    mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
    assert mode == "wal"


def test_an_item_is_never_recorded_twice_and_the_batch_is_all_or_nothing(tmp_path: Path) -> None:
    with Ledger.open(str(tmp_path / "l.sqlite")) as led:
        led.record([Row("a", "accepted", category="x")])
        with pytest.raises(LedgerError, match="'a' is already recorded"):
            led.record([Row("c", "accepted", category="x"), Row("a", "refused", reason="r")])
        with pytest.raises(LedgerError, match="'d' is already recorded"):
            led.record([Row("d", "accepted", category="x"), Row("d", "accepted", category="x")])
        assert led.done_ids() == {"a"}  # c and d were rolled back with their batch
        assert led.count() == 1


def test_done_ids_read_in_one_string_keep_every_id_as_it_was_written(tmp_path: Path) -> None:
    """done_ids joins the ids in SQLite and splits them here: an empty ledger, an empty
    id, and ids holding the separator (a newline) still come back exactly."""
    with Ledger.open(str(tmp_path / "l.sqlite")) as led:
        assert led.done_ids() == set()
        led.record([Row("", "accepted", category="x")])
        assert led.done_ids() == {""}
        led.record([Row("a\nb", "accepted", category="x"), Row("c", "refused", reason="r"),
                    Row("\n", "accepted", category="x")])
        assert led.done_ids() == {"", "a\nb", "c", "\n"}


def test_a_status_outside_the_two_is_refused_by_the_schema(tmp_path: Path) -> None:
    with Ledger.open(str(tmp_path / "l.sqlite")) as led:
        with pytest.raises(LedgerError, match="batch refused: CHECK constraint"):
            led.record([Row("a", "maybe")])
        assert led.count() == 0


def test_unopenable_path_is_a_ledger_error(tmp_path: Path) -> None:
    with pytest.raises(LedgerError, match="cannot open"):
        Ledger.open(str(tmp_path / "no" / "such" / "dir" / "l.sqlite"))


def test_first_wins_looks_up_a_large_batch_in_parts_and_keeps_an_id_repeated_in_it_once(
        tmp_path: Path) -> None:
    """The ids already there are looked up in parts (SQLite's bound-parameter limit): a
    batch of 1,200 with 700 known records the other 500; an id twice in one batch is
    recorded once, its second result counted as again."""
    with Ledger.open(str(tmp_path / "l.sqlite"), new_attempt=True) as led:
        assert led.record_first_wins([Row(f"i{n:05d}", "accepted") for n in range(700)]) == []
        again = led.record_first_wins([Row(f"i{n:05d}", "refused", reason="late")
                                       for n in range(1200)] + [Row("i01000", "accepted")])
        assert again == [f"i{n:05d}" for n in range(700)] + ["i01000"]
        rows = {r.id: r.status for r in led.rows()}
    assert len(rows) == 1200 and rows["i00000"] == "accepted" and rows["i01000"] == "refused"


def test_first_result_wins_and_a_second_one_is_counted_not_recorded(tmp_path: Path) -> None:
    path = str(tmp_path / "l.sqlite")
    with Ledger.open(path, new_attempt=True) as led:
        assert led.record_first_wins([Row("a", "accepted", category="x"),
                                      Row("b", "refused", reason="r")]) == []
        again = led.record_first_wins([Row("a", "refused", reason="late and different"),
                                       Row("c", "accepted", category="y")])
        assert again == ["a"]
        led.count_re_executed(2)
        assert led.re_executed() == 3
    with Ledger.open(path, new_attempt=True) as led:  # the count survives a new attempt
        assert led.re_executed() == 3
        assert [r.to_result() for r in led.rows()] == [
            {"id": "a", "status": "accepted", "category": "x"},
            {"id": "b", "status": "refused", "reason": "r"},
            {"id": "c", "status": "accepted", "category": "y"}]
