"""Where a run's evidence copy may live: never where the bot keeps its own records.

The evidence home is ``results.copy_to / <run id>``. A fetch replaces it whole with the
node's copy, so it must never equal, contain or lie inside a run directory, the runs folder
or the bot's state: with ``copy_to: runs`` beside ``runs_dir: runs`` the home would be the
run directory itself, and the node's copy would replace the bot's ``spec.json``,
``remote.json``… (docs/security.md). Pure: paths in (resolved by the caller), a sentence out.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import PurePath


def overlap(home: PurePath, places: Sequence[tuple[str, PurePath]]) -> str | None:
    """How ``home`` meets one of ``places`` (what it is, where), or None when it meets
    none of them."""
    for what, place in places:
        if home == place:
            return f"it is {what} ({place})"
        if place in home.parents:
            return f"it lies inside {what} ({place})"
        if home in place.parents:
            return f"it holds {what} ({place})"
    return None


def copy_to_overlap(copy_to: PurePath, places: Sequence[tuple[str, PurePath]]) -> str | None:
    """``overlap`` of every evidence home ``copy_to / <run id>`` a run may get, judged on
    ``copy_to`` (a manifest, before any run id exists): ``copy_to`` equal to or inside one
    of ``places`` puts every home inside it."""
    for what, place in places:
        if copy_to == place or place in copy_to.parents:
            return f"results.copy_to {copy_to} is{'' if copy_to == place else ' inside'} " \
                   f"{what} ({place})"
    return None
