"""The rows a balance message shows (``MAX_TABLE_ROWS``): every refusal first (they are
what a reader looks for), then the first ids, all in id order (in recording order a
volume's box began wherever its fastest worker's first batch did, doc-00051); of a stream
of items in one pass and bounded memory (``ShownRows``, the recheck of a large volume)."""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Iterator
from typing import Any

from bot.messages.views import MAX_TABLE_ROWS


class ShownRows:
    """The rows shown of a stream of items, in one pass and bounded memory: every refusal
    up to ``MAX_TABLE_ROWS``, the smallest accepted ids (a heap of that size), the count."""

    def __init__(self) -> None:
        self.count = 0
        self.refused: list[dict[str, Any]] = []
        self.accepted: list[tuple[_Desc, int, dict[str, Any]]] = []  # a max-heap by id

    def seen(self, items: Iterable[dict[str, Any]]) -> Iterator[dict[str, Any]]:
        for item in items:
            if item.get("rerun") is True:  # run again after its output was lost: it
                self._drop(str(item.get("id")))  # replaces the row of its first outcome
            else:
                self.count += 1
            if item.get("status") == "refused":
                if len(self.refused) < MAX_TABLE_ROWS:
                    self.refused.append(item)
            else:
                self._keep(item)
            yield item

    def _drop(self, iid: str) -> None:
        """The row kept for ``iid``, if any, let go (a few hundred rows looked at)."""
        self.refused = [i for i in self.refused if str(i.get("id")) != iid]
        kept = [e for e in self.accepted if e[0].text != iid]
        if len(kept) != len(self.accepted):
            self.accepted = kept
            heapq.heapify(self.accepted)

    def _keep(self, item: dict[str, Any]) -> None:
        iid = str(item.get("id"))
        entry = (_Desc(iid), self.count, item)
        if len(self.accepted) < MAX_TABLE_ROWS:
            heapq.heappush(self.accepted, entry)
        elif iid < self.accepted[0][0].text:
            heapq.heapreplace(self.accepted, entry)

    def rows(self) -> list[dict[str, Any]]:
        room = MAX_TABLE_ROWS - len(self.refused)
        accepted = sorted((e[2] for e in self.accepted), key=lambda i: str(i.get("id")))[:room]
        return sorted(self.refused + accepted, key=lambda i: str(i.get("id")))


class _Desc:
    """An id ordered backwards, so ``heapq``'s smallest is the largest id kept."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        self.text = text

    def __lt__(self, other: _Desc) -> bool:
        return self.text > other.text
