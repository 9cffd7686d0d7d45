"""One call of a handler on one batch, keeping what a failure leaves behind.

A handler gets a list of items and returns a list of results, so when it raises halfway
every result of its batch is lost and the batch must be run again. Two things survive a
failure and are kept here (docs/volume.md, "What a failing input costs"):

- a handler written as a **generator** (``yield`` one result per item) has handed over
  every result it yielded before it raised (or before the item clock interrupted it):
  those are complete and are recorded; only the items without a result are run again;
- the items are handed to the handler as a list that notes how far the handler's
  iteration got: an exception raised while the handler iterated, before it reached the
  end, was raised while it worked on the last item it took. That item is the **suspect**,
  tried alone once to confirm (``runner/volume_queue.py``); the items the handler never
  reached are known to have caused nothing. A handler that took every item before it
  failed (``list(items)``, a GPU batch built first) tells nothing: its batch is halved.

Standard library only.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Dict, List, Optional, Sequence

from runner.inputs import Item


class TrackedItems(List[Item]):
    """The batch as the handler sees it: a plain list, whose iteration is noted (how many
    items the latest ``for item in items`` handed out, and whether it reached the end).
    Indexing and slicing are a list's own and are not noted."""

    def __init__(self, items: Sequence[Item]) -> None:
        super().__init__(items)
        self.handed = 0
        self.iterated = False
        self.exhausted = False

    def __iter__(self) -> Iterator[Item]:
        self.iterated, self.exhausted, self.handed = True, False, 0
        return self._walk()

    def _walk(self) -> Iterator[Item]:
        for index in range(len(self)):
            self.handed = index + 1
            yield list.__getitem__(self, index)
        self.exhausted = True


class BatchCall:
    """``handler(items, ctx)`` as a zero-argument call (for ``ItemClock.call``): a result
    that is an iterator (a generator handler) is drained into ``results`` one by one, so
    what it yielded before a failure is still there."""

    def __init__(self, handler: Any, items: Sequence[Item], ctx: Any) -> None:
        self.handler, self.ctx = handler, ctx
        self.items = TrackedItems(items)
        self.results: List[Any] = []
        self.streamed = False

    def __call__(self) -> Any:
        out = self.handler(self.items, self.ctx)
        if not isinstance(out, Iterator):
            return out  # a list (or anything else: the recorder's audit judges it)
        self.streamed = True
        for result in out:
            self.results.append(result)
        return self.results

    @property
    def consumed(self) -> int:
        """Items the handler took from its batch: all of them unless its iteration
        stopped early (a handler that indexes instead of iterating: all)."""
        items = self.items
        if items.iterated and not items.exhausted:
            return items.handed
        return len(items)

    def suspect(self) -> Optional[str]:
        """The id of the item the handler was working on when it failed: the last one its
        unfinished iteration took, when no result of it was yielded; None when the
        iteration says nothing (never iterated, or run to its end)."""
        items = self.items
        if not items.iterated or items.exhausted or items.handed < 1:
            return None
        iid = items[items.handed - 1].id
        done = {r.get("id") for r in self.results if isinstance(r, dict)}
        return None if iid in done else iid

    def partial(self) -> Dict[str, Any]:
        """What a failed call leaves for the driver: the results a generator yielded and
        the suspect, each only when there is one (a reply keeps its older shape else)."""
        out: Dict[str, Any] = {}
        if self.streamed and self.results:
            out["results"] = list(self.results)
        suspect = self.suspect()
        if suspect is not None:
            out["suspect"] = suspect
        return out


def call_handler(handler: Any, items: Sequence[Item], ctx: Any) -> Any:
    """``handler(items, ctx)`` with a generator's results drained into a list (the pilot's
    memory stage, which must run the handler's work, not only create its generator)."""
    return BatchCall(handler, items, ctx)()
