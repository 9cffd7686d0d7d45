"""The ``collect`` stage: a several-node volume's outputs brought to the head after the
items (``runner/volume_collect.py``), before the balance and the evidence."""

from __future__ import annotations

from typing import Any, Dict

from runner.stage import StageContext


def collect(ctx: StageContext) -> Dict[str, Any]:
    """Every other node's outputs to the head, each verified; a resume brings only what
    is missing. Fails naming the node and the file when one is refused or missing."""
    from runner.volume_collect import collect as collect_outputs

    return collect_outputs(ctx)
