"""One handler call on one batch (runner/handler_call.py): what a failure leaves behind."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

from runner.handler_call import BatchCall, TrackedItems, call_handler
from runner.inputs import Item


def _items(n: int) -> list[Item]:
    return [Item(f"i{k}", f"/x/i{k}", 1) for k in range(n)]


def _result(item: Item) -> dict[str, Any]:
    if item.id == "i3":
        raise ValueError(f"bad {item.id}")
    return {"id": item.id, "status": "accepted"}


def test_a_generator_keeps_what_it_yielded_and_names_the_input_it_raised_on() -> None:
    def handle(items: list[Item], ctx: Any) -> Iterator[dict[str, Any]]:
        for item in items:
            yield _result(item)

    call = BatchCall(handle, _items(6), None)
    with pytest.raises(ValueError):
        call()
    assert call.partial() == {"results": [{"id": f"i{k}", "status": "accepted"}
                                          for k in range(3)], "suspect": "i3"}
    assert call.consumed == 4  # i4 and i5 never reached
    assert BatchCall(handle, _items(3), None)() == [{"id": f"i{k}", "status": "accepted"}
                                                    for k in range(3)]


def test_a_list_handler_names_its_suspect_but_keeps_no_result() -> None:
    def handle(items: list[Item], ctx: Any) -> list[dict[str, Any]]:
        return [_result(item) for item in items]

    call = BatchCall(handle, _items(6), None)
    with pytest.raises(ValueError):
        call()
    assert call.partial() == {"suspect": "i3"}


def test_a_handler_that_took_its_whole_batch_first_names_no_suspect() -> None:
    """``list(items)`` (a GPU batch built first), or indexing: the iteration says nothing,
    the batch is split blind (runner/volume_queue.py)."""
    def whole(items: list[Item], ctx: Any) -> list[dict[str, Any]]:
        return [_result(item) for item in list(items)]

    def indexed(items: list[Item], ctx: Any) -> list[dict[str, Any]]:
        return [_result(items[k]) for k in range(len(items))]

    for handle in (whole, indexed):
        call = BatchCall(handle, _items(6), None)
        with pytest.raises(ValueError):
            call()
        assert call.partial() == {} and call.consumed == 6


def test_the_batch_is_still_a_plain_list_to_the_handler() -> None:
    items = TrackedItems(_items(4))
    assert isinstance(items, list) and items == _items(4) and len(items) == 4
    assert items[1:3] == _items(4)[1:3] and items[-1].id == "i3"
    assert [it.id for it in items] == ["i0", "i1", "i2", "i3"] and items.exhausted
    it = iter(items)
    next(it)
    assert items.handed == 1 and not items.exhausted


def test_the_memory_stage_runs_a_generator_s_work() -> None:
    ran: list[str] = []

    def handle(items: list[Item], ctx: Any) -> Iterator[dict[str, Any]]:
        for item in items:
            ran.append(item.id)
            yield {"id": item.id, "status": "accepted"}

    assert len(call_handler(handle, _items(2), None)) == 2 and ran == ["i0", "i1"]
