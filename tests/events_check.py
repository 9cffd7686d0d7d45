""""Every event recorded once, in order, none lost", as the store keeps a run's stream.

The store keeps every event but ``progress``, and of those each attempt's latest (an attempt
opens at its ``run.started``; bot/store/progress.py), counting the others. ``kept`` applies
that rule to what a runner wrote, written here again on its own so that a store that drops
or doubles an event fails the comparison.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from runner.events import Event


class _Store(Protocol):
    def events(self, run_id: str, *, after_seq: int = 0) -> list[Event]: ...
    def event_count(self, run_id: str) -> int: ...
    def get_run(self, run_id: str) -> dict[str, Any]: ...


def kept(written: Sequence[Event]) -> list[Event]:
    """The events of ``written`` (in seq order) the store gives back."""
    last_progress: dict[int, int] = {}  # attempt -> index of its latest progress
    attempt = 0
    for n, event in enumerate(written):
        if event.type == "run.started":
            attempt = event.seq
        elif event.type == "progress":
            last_progress[attempt] = n
    latest = set(last_progress.values())
    return [e for n, e in enumerate(written) if e.type != "progress" or n in latest]


def assert_recorded_whole(store: _Store, run_id: str,
                          written: Sequence[Event] | None = None) -> list[Event]:
    """The run's recorded events are in seq order, each once; counted with the progress
    events folded, they are its ``last_seq`` (and, given what the runner ``written``, all
    of it: seqs 1…n). Returns the recorded events."""
    events = store.events(run_id)
    seqs = [e.seq for e in events]
    assert seqs == sorted(set(seqs)), seqs
    last = int(store.get_run(run_id)["last_seq"])
    assert store.event_count(run_id) == last, (store.event_count(run_id), last)
    if written is not None:
        assert [e.seq for e in written] == list(range(1, len(written) + 1))
        want = [e.seq for e in kept(written)]
        assert seqs == want, (f"recorded {len(seqs)}, written {len(want)} kept: "
                              f"only recorded {sorted(set(seqs) - set(want))[:20]}, "
                              f"only written {sorted(set(want) - set(seqs))[:20]}")
        assert last == len(written)
    return events
