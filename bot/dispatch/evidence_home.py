"""The evidence home checked again where the fetch is about to replace it.

The manifest's rules refuse a ``results.copy_to`` in the runs folder
(``bot/manifest/results_rules.py``); a run created before that rule, or a folder moved
since, is refused here too, before a byte is fetched: the home (``copy_to / <run id>``)
must not equal, contain or lie inside the run directory, the runs folder, nor the bot's
own folders it was given (``keep_out``: its runs folder and state).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bot.dispatch.base import RunHandle
from bot.errors import DispatchError
from bot.pilot.evidence_home import overlap


class EvidenceHomeRefused(DispatchError):
    """The evidence copy would land where the bot keeps its own records."""


def refuse_evidence_home(handle: RunHandle, home: Path, keep_out: Sequence[Path] = ()) -> None:
    """``EvidenceHomeRefused`` when ``home`` meets the run directory, the runs folder or
    one of ``keep_out``; every path compared resolved."""
    run_dir = Path(os.path.realpath(handle.run_dir))
    places = [("the run directory", run_dir), ("the runs folder", run_dir.parent)]
    places += [("a folder of the bot's own", Path(os.path.realpath(p))) for p in keep_out]
    why = overlap(Path(os.path.realpath(home)), places)
    if why is not None:
        raise EvidenceHomeRefused(
            f"run {handle.run_id}: the evidence copy would be fetched to {home}, but {why}: "
            "the fetch replaces the evidence home whole, so it never is where the bot keeps "
            "its records of a run; the fetch is refused and nothing was replaced. Give "
            "results.copy_to a folder outside the runs folder (e.g. evidence/) in a new "
            "attempt; the run's events and verdict are kept")
