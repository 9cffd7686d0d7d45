"""Where an SSH pilot's node finds the volume's inputs for its calibration.

The pilot's node calibrates the volume on a random sample of the volume's own inputs
(runner/stages/calibrate.py): the pilot's node is the node, so it is measured there. The
spec names the corpus as the bot host sees it (bot/pilot/specbuild.py); on an SSH node:

- a corpus already on the nodes (``volume.inputs.on_nodes``) is sampled there, at that path
  (a pilot's node that does not hold it skips the stage, saying it cannot list it);
- a corpus the pilot's upload carries (in the project and not left out of it, or the
  pilot's own inputs) is sampled at its path on the node;
- any other (a corpus beside the pilot's inputs, left out of the pilot's upload so that it
  sends its 12 inputs, not 100,000; one outside the project): the bot lists it, draws the
  sample with the run's seed (``runner.spec.draw_sample``, the node's own rule) and sends
  those files with the pilot, into ``SAMPLE_DIR`` of its run directory on the node (a bot
  record: never fetched back). The spec's calibration then names that folder and how many
  inputs the sample was drawn from. A warm-up batch per worker and ``batches_max`` batches
  are sent, fewer past ``SAMPLE_MAX_BYTES`` (never fewer than ``batches`` batches and the
  warm-ups: the node runs inputs again rather than time too few).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.inputs import InputsError, list_dir
from runner.spec import CalibrationSpec, draw_sample

SAMPLE_DIR = "calibration-sample"
SAMPLE_MAX_BYTES = 256 << 20
CPU_WORKERS = 4            # runner/stages/calibrate.py's CPU_WORKERS_MAX
DRAWN_ON = "the bot host"


@dataclass(frozen=True)
class CalibrationCopy:
    """The spec's ``calibration`` for the node, and the sample's files to send (none when
    the node holds the corpus): file name -> the file on the bot host."""

    calibration: dict[str, Any]
    remote: str | None = None
    files: dict[str, Path] = field(default_factory=dict)


def calibration_copy(spec: dict[str, Any], on_nodes: str | None, remote_run_dir: str,
                     node_path: Callable[[Path], str | None]) -> CalibrationCopy | None:
    """Where the node calibrates (``node_path``: the node's path of a bot-host folder the
    pilot's upload carries, else None); None when the spec has no calibration."""
    raw = spec.get("calibration")
    if not isinstance(raw, dict):
        return None
    if on_nodes:
        return CalibrationCopy({**raw, "dir": on_nodes})
    local = Path(str(raw.get("dir") or "")).resolve()
    there = node_path(local)
    if there is not None:
        return CalibrationCopy({**raw, "dir": there})
    cal = CalibrationSpec(**{k: v for k, v in raw.items()
                             if k in CalibrationSpec.__dataclass_fields__})
    try:
        files = list_dir(str(local), cal.pattern or "*")
    except InputsError:  # the node's listing fails the same way: the stage says why
        return CalibrationCopy(raw)
    drawn = _sent(draw_sample(files, cal.seed, cal.sample_size(CPU_WORKERS)), cal,
                  _workers(spec, cal))
    remote = f"{remote_run_dir}/{SAMPLE_DIR}"
    return CalibrationCopy(
        {**raw, "dir": remote, "listed": len(files),
         "listed_bytes": sum(f.size for f in files), "drawn_on": DRAWN_ON},
        remote, {Path(item.path).name: Path(item.path) for item in drawn})


def _workers(spec: dict[str, Any], cal: CalibrationSpec) -> int:
    """The workers the node may start: its cards ÷ cards per worker, or a CPU node's."""
    cards = (spec.get("hardware") or {}).get("node_cards")
    if cal.gpus and isinstance(cards, int) and cards > 0:
        return max(1, cards // max(1, cal.cards_per_worker))
    return CPU_WORKERS


def _sent(drawn: list[Any], cal: CalibrationSpec, workers: int) -> list[Any]:
    """The draw's first inputs: all the calibration may use, or, past ``SAMPLE_MAX_BYTES``,
    those of ``batches`` batches and a warm-up batch per worker."""
    size = max(1, cal.batch_size)
    least = size * (max(1, cal.batches) + workers)
    out: list[Any] = []
    total = 0
    for item in drawn:
        if len(out) >= least and total + item.size > SAMPLE_MAX_BYTES:
            break
        out.append(item)
        total += item.size
    return out
