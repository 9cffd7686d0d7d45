"""What a task is handed to record its results: the ``ItemRecorder`` protocol.

The pilot stage's ``Recorder`` (runner/stages/pilot.py) is the implementation: it audits a
batch's results, commits them to the ledger, then emits their events. The ways a task runs
(a handler over batches, a command, the trainer, Blender's frames, the volume's Ray
workers) take this protocol instead of ``Any``, so mypy checks their calls without those
modules importing the stage that runs them. Standard library only.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Protocol, Set, Tuple

from runner.ledger import Ledger


class ItemRecorder(Protocol):
    @property
    def ledger(self) -> Ledger:
        """The run's ledger (its attempt number names a command's work directory)."""

    @property
    def recorded(self) -> Set[str]:
        """The ids recorded so far, this attempt's and the earlier ones'."""

    @property
    def total(self) -> int:
        """How many inputs the run has."""

    @property
    def outputs_dir(self) -> str:
        """Where accepted outputs go."""

    def record(self, asked: Iterable[str], results: Any,
               elapsed_s: Optional[float] = None) -> int:
        """Audit, commit, then emit the results of the items ``asked``; returns how many
        were recorded (a result that cannot be recorded becomes a ledger anomaly)."""

    def record_first_wins(self, asked: Iterable[str], results: Any,
                          elapsed_s: Optional[float] = None) -> Tuple[int, int]:
        """``record`` for items that may be recorded already: (recorded now, re-executed)."""
