"""Two checks a start makes of a run's own records, against what the bot itself decided.

- ``refuse_evidence_place``: at submission, ``results.copy_to`` against the runs folder the
  run will really use (the manifest's ``runs_dir`` or the bot's own) and the bot's state:
  the evidence home must never be a run directory (``bot/manifest/results_rules.py``;
  the manifest's rules check it too when they are told the bot's folders).
- ``check_spec_paths``: at each start (a resume above all), the paths of the run's
  ``spec.json`` against those its database record implies (the manifest as submitted and
  its project folder): a spec changed since (by a fetch of old, by hand) would have the
  upload send whatever bot-host folder it names. A mismatch refuses the start, naming the
  field.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from bot.errors import DispatchError, ManifestError, Problem
from bot.manifest.load import LoadedManifest
from bot.manifest.results_rules import LOC, evidence_place_problem
from bot.manifest.source import format_loc
from bot.pilot.specbuild import runs_dir_for, spec_paths
from bot.settings import Settings
from bot.store import Run


def bot_places(settings: Settings) -> list[tuple[str, Path]]:
    """The bot's own folders no evidence copy may touch: its runs folder and its state."""
    return [("the bot's runs folder", settings.runs_dir),
            ("the bot's state folder", settings.db_path.parent)]


def refuse_evidence_place(loaded: LoadedManifest, settings: Settings) -> None:
    """ManifestError at ``results.copy_to`` (with its line) when the evidence home would
    meet the run's runs folder or the bot's own folders."""
    runs = runs_dir_for(loaded, settings.runs_dir)
    places = [("the runs folder of this run", runs), *bot_places(settings)]
    why = evidence_place_problem(loaded.manifest.results, loaded.project_dir, places)
    if why is None:
        return
    line, column = loaded.marks.locate(LOC)
    raise ManifestError([Problem(format_loc(LOC), why, line, column)], source=loaded.source)


def check_spec_paths(run: Run) -> None:
    """DispatchError naming the first field of ``spec.json`` whose path is not the one the
    run's record implies (or a spec that names another run, or cannot be read)."""
    if run.manifest is None or run.project_dir is None or run.spec_path is None:
        return  # an older record: nothing to hold the spec to
    try:
        spec = json.loads(Path(run.spec_path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise DispatchError(f"run {run.id}: its spec {run.spec_path} cannot be read: "
                            f"{exc}") from exc
    volume = run.manifest.volume
    ours: dict[str, Any] = {"run_id": run.id, **spec_paths(
        run.manifest, Path(run.project_dir),
        inputs=volume.inputs if run.kind == "volume" and volume is not None else None)}
    for field, value in ours.items():
        theirs = _dig(spec, field)
        if _real(theirs) != _real(value):
            raise DispatchError(
                f"run {run.id}: its spec.json names {field} {theirs!r}, but the run was "
                f"submitted with {value!r} (its record): the spec was changed since it was "
                "written, so nothing is sent or started. Submit the manifest again for a "
                "new attempt")


def _real(value: Any) -> Any:
    """A path as it resolves now (a link swapped in since resolves alike on both sides:
    the inputs' own check names that one), lists element by element; other values as is."""
    if isinstance(value, list):
        return [_real(v) for v in value]
    if isinstance(value, str) and value.startswith("/"):
        return os.path.realpath(value)
    return value


def _dig(doc: Any, path: str) -> Any:
    for key in path.split("."):
        doc = doc.get(key) if isinstance(doc, dict) else None
    return doc
