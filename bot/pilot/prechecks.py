"""What the service computes from a manifest before dispatch: expected ids, changes."""

from __future__ import annotations

from typing import Any

from bot.manifest.load import LoadedManifest
from bot.manifest.rules import list_inputs


def expected_inputs(loaded: LoadedManifest, inputs: Any | None = None) -> list[str]:
    """The input ids the balance must account for (the volume's when ``inputs`` is given)."""
    if inputs is None:
        return [f.id for f in loaded.input_files()]
    return [f.id for f in list_inputs((loaded.project_dir / inputs.dir).resolve(), inputs.pattern,
                                      getattr(inputs, "frames", None))]


def previous_changes(previous: dict[str, Any] | None,
                     manifest_json: dict[str, Any]) -> list[dict[str, Any]]:
    """Field-by-field changes against ``previous``, the previous attempt of the pilot."""
    if previous is None or not previous.get("manifest_json"):
        return []
    from bot.pilot.attempts import diff_manifests, factors

    changes = diff_manifests(previous["manifest_json"], manifest_json)
    moving = set(factors(changes))
    return [{**c.to_dict(), "factor": c.path in moving} for c in changes]
