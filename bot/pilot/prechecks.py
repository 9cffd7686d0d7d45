"""What the service computes from a manifest before dispatch: expected ids, changes."""

from __future__ import annotations

from typing import Any

from bot.errors import Problem
from bot.manifest.load import LoadedManifest
from bot.manifest.model import Inputs, VolumeInputs
from bot.manifest.rules import Report, check_input_files
from bot.pilot.record import Run


def expected_inputs(loaded: LoadedManifest,
                    inputs: Inputs | VolumeInputs | None = None) -> list[str]:
    """The input ids the balance must account for (the volume's when ``inputs`` is given),
    from the folder as listed when the manifest was loaded."""
    return [f.id for f in loaded.listing(inputs).inputs]


def volume_problems(loaded: LoadedManifest) -> list[Problem]:
    """What would stop the volume's run from being created, found before an approval is
    recorded: its inputs folder, pattern, count, ids and expected refusals, with their lines
    (``validate`` only warns about a folder it cannot see when the volume runs elsewhere)."""
    volume = loaded.manifest.volume
    if volume is None:
        return []
    report = Report(loaded.marks)
    check_input_files(volume.inputs, loaded.project_dir, ("volume", "inputs"), report,
                      required=True)
    return report.errors


def previous_changes(previous: Run | None,
                     manifest_json: dict[str, Any]) -> list[dict[str, Any]]:
    """Field-by-field changes against ``previous``, the previous attempt of the pilot (none
    when it has no manifest that still validates: see ``Run.manifest_problem``)."""
    if previous is None or previous.manifest is None:
        return []
    from bot.pilot.attempts import diff_manifests, factors

    changes = diff_manifests(previous.manifest_json, manifest_json)
    moving = set(factors(changes))
    return [{**c.to_dict(), "factor": c.path in moving} for c in changes]
