"""The forecast's records: what it is given (``ForecastInputs``, ``Setup``) and what it
gives (``Forecast``, its ``Figure`` list). Frozen; the arithmetic is in ``bot/pilot/forecast.py``
and the modules it calls."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from bot.pilot.calibration import Calibration
from bot.pilot.forecast_stats import Sample


@dataclass(frozen=True)
class Setup:
    """What the volume pays before its items run, as the pilot measured it (None: not
    measured). ``diagnostics_s``: the pilot's stages before its pilot stage (the volume
    runs the same); ``dispatch_s``: from the pilot's dispatch to its runner's start (upload
    and launch); ``proof_s``: the pilot's card stages (a node's card proof runs them)."""

    diagnostics_s: float | None = None
    dispatch_s: float | None = None
    proof_s: float | None = None
    ssh: bool = False
    inputs_on_nodes: bool = False  # volume.inputs.on_nodes: checked there, not uploaded
    uploaded_bytes: int | None = None  # what the pilot's dispatch sent its node (remote.json)


@dataclass(frozen=True)
class ForecastInputs:
    samples: tuple[Sample, ...]
    accepted: int
    volume_count: int
    rented_cards: int
    cards_per_lot: int
    lots: int
    days: int
    lot_price_usd_per_day: Decimal
    now: datetime
    task_kind: str = "classify"
    command: bool = False
    volume_bytes: int | None = None
    volume_max_bytes: int | None = None
    volume_where: str = ""
    volume_listed: bool = True         # False: the count is volume.inputs.expected_count
    healthy_cards: int | None = None   # proven on the pilot's node
    # Each node's healthy cards as its card proof at the volume's dispatch found them, in
    # volume.nodes order (0: a node dropped; None: its stages judged no card, its share
    # counts); None: the nodes are not proven yet (before approval)
    node_cards: tuple[int | None, ...] | None = None
    cards_per_worker: int = 1
    nodes: int = 1
    pilot_node: int | None = 0         # which of the volume's nodes the pilot proved; None: none
    gpus: bool = True                  # the volume's workers ask for cards (else: CPU workers)
    cores: int | None = None           # the pilot node's cores (a CPU volume's workers)
    batch_size: int = 1                # the volume's batch (its last round may idle workers)
    setup: Setup = field(default_factory=Setup)
    peak_memory_gib: float | None = None
    card_memory_gib: float | None = None
    lease_starts_at: datetime | None = None
    # The torch threads the pilot measured its items with, and why (its pilot stage's facts;
    # None: not recorded, e.g. no torch); ``torch_threads``: the manifest's task.torch_threads
    pilot_threads: int | None = None
    pilot_threads_why: str | None = None
    torch_threads: int | None = None
    # The volume's calibration on the pilot's node (bot/pilot/calibration.py); None: none
    # ran; ``calibrate``: the manifest's volume.calibrate
    calibration: Calibration | None = None
    calibrate: bool = True
    # The pilot's evidence stage: (seconds, files, bytes) and the pilot's items
    evidence: tuple[float, int, int] | None = None
    pilot_items: int = 0
    # The pilot's refusals: all of them, and those interrupted at the item timeout (its
    # pilot stage's ``timed_out``); ``item_timeout_s``: the manifest's task.item_timeout_s
    # The pilot's own fetch of its results to the bot host: (seconds, files, bytes) (an
    # SSH pilot; None: not measured); ``outputs_on_nodes``: volume.outputs_on_nodes
    fetch: tuple[float, int, int] | None = None
    outputs_on_nodes: bool = False
    # A ``collect`` stage the run measured: (seconds, files, bytes it brought to the head);
    # None: none ran (a pilot on one node), the collection is estimated from the fetch
    collect: tuple[float, int, int] | None = None
    pilot_refused: int = 0
    pilot_timed_out: int = 0
    item_timeout_s: float | None = None


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    value: str
    formula: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "value": self.value,
                "formula": self.formula}


@dataclass(frozen=True)
class Forecast:
    possible: bool
    reason: str | None = None
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
    fits: bool | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: seconds as numbers, money as exact decimal strings, times as ISO."""
        return {"possible": self.possible, "reason": self.reason, "fits": self.fits,
                "figures": [f.to_dict() for f in self.figures], "notes": list(self.notes),
                **self.numbers}

    def figure(self, key: str) -> Figure:
        return next(f for f in self.figures if f.key == key)
