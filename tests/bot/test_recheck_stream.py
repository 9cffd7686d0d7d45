"""The bot's own balance recheck streams its items: a million are never held at once.

``Store.iter_items`` pages by seq, ``ShownRows`` keeps the rows a message shows in one
pass (every refusal first, then the smallest accepted ids, the count), and
``compute_balance`` keeps each id's first result as (status, category, reason). Each gives
what the whole-list code gave: the same rows, the same balance."""

from __future__ import annotations

import random
from pathlib import Path

from bot.messages.views import MAX_TABLE_ROWS
from bot.service.shown_rows import ShownRows
from bot.store import Store
from runner.balance import compute_balance
from tests.bot.test_store import ev, new_run


def items(count: int, seed: int) -> list[dict[str, object]]:
    rng = random.Random(seed)
    out: list[dict[str, object]] = []
    for n in rng.sample(range(count * 2), count):
        refused = rng.random() < 0.1
        out.append({"id": f"doc-{n:05d}", "status": "refused" if refused else "accepted",
                    "category": None if refused else rng.choice(["a", "b", "zz"]),
                    "reason": "empty" if refused else None})
    return out


def rows_shown(items: list[dict[str, object]]) -> list[dict[str, object]]:
    """The rows shown, computed over the whole list: what the stream must give."""
    refused = [i for i in items if i.get("status") == "refused"][:MAX_TABLE_ROWS]
    room = MAX_TABLE_ROWS - len(refused)
    accepted = sorted((i for i in items if i.get("status") != "refused"),
                      key=lambda i: str(i.get("id")))[:room]
    return sorted(refused + accepted, key=lambda i: str(i.get("id")))


def test_the_rows_shown_are_the_same_streamed_or_whole() -> None:
    for count, seed in ((5, 1), (MAX_TABLE_ROWS, 2), (2_000, 3), (2_000, 4)):
        whole = items(count, seed)
        shown = ShownRows()
        assert list(shown.seen(iter(whole))) == whole
        assert shown.count == count and shown.rows() == rows_shown(whole)


def test_the_balance_is_the_same_from_compact_results() -> None:
    results = items(3_000, 5)
    results[0].update(status="refused", category=None, reason="empty")  # expected so
    expected = [str(r["id"]) for r in results[:-7]] + ["never-1", "never-2"]
    results += [results[3], {"id": "made-up", "status": "accepted", "category": "a"},
                {"id": results[10]["id"], "status": "odd"}]
    got = compute_balance(expected, [str(results[0]["id"])], ["a", "b"], iter(results),
                          keep_rows=True)
    # "zz" outside the categories; results[3] twice; "made-up" invented; the 7 left out
    # of the expected ids invented too; never-1 and never-2 missing, so the sums fall short
    assert {p.kind for p in got.problems} == {"bad_category", "count_mismatch", "duplicate",
                                              "invented", "missing"}
    assert sorted(p.id for p in got.problems if p.kind == "missing") == ["never-1", "never-2"]
    assert [p.id for p in got.problems if p.kind == "duplicate"] == [results[3]["id"],
                                                                     results[10]["id"]]
    assert got.accepted + got.refused == len(expected) - 2
    assert {r["id"] for r in got.rows} == set(expected) - {"never-1", "never-2"}
    refused = [r for r in got.rows if r["status"] == "refused"]
    assert refused and all(r["reason"] == "empty" and r["category"] is None for r in refused)


def test_items_are_read_a_page_at_a_time_in_seq_order(tmp_path: Path) -> None:
    store = Store(tmp_path / "p.db")
    new_run(store)
    batch = [ev(n, "item.done", id=f"i{n}", status="accepted", category="x")
             for n in range(1, 12)]
    store.record_events("r1", batch, 100)
    assert list(store.iter_items("r1", page=3)) == store.items("r1")
    assert [i["id"] for i in store.iter_items("r1", page=4)] == [f"i{n}" for n in range(1, 12)]


def test_a_recount_over_by_the_inputs_forgotten_for_lost_outputs_is_explained() -> None:
    from bot.service.follower import _forgotten_explain

    runner = {"ok": False, "accepted": 90, "refused": 5, "total": 100, "forgotten_pending": 5}
    ours = {"ok": True, "accepted": 95, "refused": 5, "total": 100}
    assert _forgotten_explain(runner, ours)  # the 5 still accepted in the item events
    assert not _forgotten_explain({**runner, "ok": True}, ours)  # an ok balance: no excuse
    assert not _forgotten_explain({**runner, "forgotten_pending": 4}, ours)
    assert not _forgotten_explain({**runner, "forgotten_pending": True}, ours)
    assert not _forgotten_explain(runner, {**ours, "refused": 6})
    assert not _forgotten_explain({k: v for k, v in runner.items()
                                   if k != "forgotten_pending"}, ours)


def test_a_rerun_replaces_its_first_row_in_the_rows_shown_and_counts_once() -> None:
    first = [{"id": "doc-1", "status": "accepted", "category": "a", "reason": None},
             {"id": "doc-2", "status": "refused", "category": None, "reason": "empty"}]
    again = [{"id": "doc-1", "status": "refused", "category": None, "reason": "timeout",
              "rerun": True},
             {"id": "doc-2", "status": "accepted", "category": "b", "reason": None,
              "rerun": True}]
    shown = ShownRows()
    assert list(shown.seen(iter(first + again))) == first + again
    assert shown.count == 2
    assert shown.rows() == sorted(again, key=lambda i: str(i["id"]))
