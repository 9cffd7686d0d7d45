"""The small readings every dispatcher shares (bot/dispatch/base.py): what a node printed
as one JSON object, and the first difference between two listings."""

from __future__ import annotations

from bot.dispatch.base import first_difference, json_object


def test_a_node_s_answer_is_one_json_object_or_nothing() -> None:
    assert json_object('{"locked": "r1"}\n') == {"locked": "r1"}
    for other in ("", "Welcome to the node!", "[1, 2]", "3"):
        assert json_object(other) is None


def test_the_first_difference_between_two_listings_in_their_order() -> None:
    ours = {"a": 1, "b": 2, "c": 3}
    assert first_difference(ours, dict(ours)) is None
    assert first_difference(ours, {"a": 1, "c": 3}) == ("b", "missing")
    assert first_difference(ours, {**ours, "aa": 0}) == ("aa", "extra")
    assert first_difference(ours, {"a": 1, "b": 9, "c": 0}) == ("b", "differs")
    # in the caller's order: by item id first (c before b here)
    order = {"c": 0, "b": 1, "a": 2}
    assert first_difference(ours, {"a": 0, "b": 0}, key=order.__getitem__) == ("c", "missing")
