"""The ``results`` section's rule: the evidence copy never lands among the bot's records.

The evidence home is ``results.copy_to / <run id>``; the fetch of an SSH run replaces it
whole with the node's copy. With ``copy_to`` equal to the runs folder (``runs_dir: runs``,
``copy_to: runs``) the home is the run directory itself, and the node's copy would
replace the bot's ``spec.json``, ``remote.json``… (issue 32). So ``copy_to`` may not be,
nor lie inside, ``results.runs_dir`` or the bot's own runs folder and state; refused
naming ``results.copy_to`` and its line, from a file and from Slack alike. The fetch
checks the home again (``bot/dispatch/evidence_home.py``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from bot.manifest.model import Results
from bot.pilot.evidence_home import copy_to_overlap

LOC = ("results", "copy_to")


def evidence_place_problem(results: Results | None, project_dir: Path,
                           bot_places: Sequence[tuple[str, Path]] = ()) -> str | None:
    """Why ``results.copy_to`` cannot hold evidence homes (None: it can, or it is a URL or
    absent). ``bot_places``: the bot's own folders (its runs folder, its state)."""
    if results is None or not results.copy_to:
        return None
    copy_to = results.copy_to
    if "://" in copy_to and not copy_to.startswith("file://"):
        return None
    target = Path(os.path.realpath(project_dir / copy_to.removeprefix("file://")))
    places = [(what, Path(os.path.realpath(path))) for what, path in bot_places]
    if results.runs_dir:
        places.insert(0, ("results.runs_dir",
                          Path(os.path.realpath(project_dir / results.runs_dir))))
    why = copy_to_overlap(target, places)
    if why is None:
        return None
    return (f"{why}: the evidence copy (results.copy_to/<run id>) would land among the "
            "bot's records of its runs, which a fetch would replace with the node's copy; "
            "copy the evidence to a folder outside them (e.g. evidence/)")
