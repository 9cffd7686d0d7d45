"""The most a run's results fetch may bring back from its node, sized for the run.

A fetch brings back the run's evidence copy (``bot/nodes/ssh/fetch.py``): its records,
its outputs as plain files up to 1,000 of them or packed in shards of up to 10,000
(``runner/evidence.py``), so the files it may hold follow from the run's inputs. The cap
on files is sized from them (``FILES_BASE`` + ``FILES_PER_INPUT`` per input: room for a
handler that writes a few files per input), never above the bot host's setting
(``PREFLIGHT_FETCH_MAX_FILES``). The cap on bytes in all is sized from what the run is
expected to bring back: a pilot declares no output size, so its cap is the setting's
(``PREFLIGHT_FETCH_MAX_BYTES``); a volume's is the forecast's expected evidence copy (the
pilot's own evidence copy scaled to the volume's inputs, ``bot/pilot/forecast_after.py``)
× ``HEADROOM``, at least ``BYTES_FLOOR``, never above the setting. An expected evidence
over the setting is told before the approval (``over_ceiling``). The cap per file is the
setting's (``PREFLIGHT_FETCH_MAX_FILE_BYTES``). The plan shows the caps, for the pilot and
the volume, and the forecast the volume's as sized.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from bot.settings import Settings

FILES_BASE = 1_000  # the run's own records, event lists, the shard index, a few shards
FILES_PER_INPUT = 4
HEADROOM = 2  # × the expected evidence bytes: a volume's outputs vary around the pilot's
BYTES_FLOOR = 256 << 20  # the least a sized byte cap allows (records, a small run)
GIB = 1 << 30


@dataclass(frozen=True)
class FetchCaps:
    """The caps of one run's fetch: ``files`` and ``total_bytes`` in all, ``file_bytes``
    for one file. The defaults are the settings' defaults."""

    total_bytes: int = 4 * GIB
    file_bytes: int = 2 * GIB
    files: int = 200_000
    sized: bool = False  # ``total_bytes`` is the run's own, under the bot host's setting

    def for_inputs(self, expected: int) -> FetchCaps:
        """These caps (the bot host's upper bounds) sized for a run of ``expected``
        inputs (0: unknown, the bounds as they are)."""
        if expected <= 0:
            return self
        files = min(self.files, FILES_BASE + FILES_PER_INPUT * expected)
        return FetchCaps(self.total_bytes, self.file_bytes, files)

    def for_bytes(self, expected: float | None) -> FetchCaps:
        """These caps with the bytes in all sized for an evidence copy of ``expected``
        bytes (× ``HEADROOM``, at least ``BYTES_FLOOR``), never above these; None: as
        they are."""
        if expected is None or expected < 0:
            return self
        return self.under(_sized(expected))

    def under(self, total_bytes: int) -> FetchCaps:
        """These caps, the bytes in all no more than ``total_bytes`` (a run's own sized
        cap; 0 or less: none)."""
        if total_bytes <= 0 or total_bytes >= self.total_bytes:
            return self
        return replace(self, total_bytes=total_bytes, sized=True)

    def words(self) -> str:
        return (f"up to {self.files:,} files, {_gib(self.total_bytes)} in all, "
                f"{_gib(self.file_bytes)} per file")


def _sized(expected: float) -> int:
    """A bytes cap for an evidence copy of ``expected`` bytes: × ``HEADROOM``, at least
    ``BYTES_FLOOR`` (the one rule behind ``FetchCaps.for_bytes`` and ``sized_bytes``)."""
    return max(BYTES_FLOOR, math.ceil(expected * HEADROOM))


def _gib(n: float) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def caps_of(settings: Settings) -> FetchCaps:
    """The bot host's upper bounds, from its settings."""
    return FetchCaps(settings.fetch_max_bytes, settings.fetch_max_file_bytes,
                     settings.fetch_max_files)


def expected_evidence(forecast: Mapping[str, Any] | None) -> tuple[int, int, str] | None:
    """(files, bytes, basis) of the volume's evidence copy as the pilot's forecast expects
    it; None when the forecast has none (no evidence measured, an older forecast)."""
    fc = forecast or {}
    files, size = fc.get("evidence_files"), fc.get("evidence_bytes")
    if not isinstance(files, int) or not isinstance(size, int) or isinstance(files, bool) \
            or isinstance(size, bool) or files < 0 or size < 0:
        return None
    return files, size, str(fc.get("evidence_basis") or "the pilot's items")


def sized_bytes(forecast: Mapping[str, Any] | None) -> int:
    """A volume's own bytes cap from its pilot's forecast (the expected evidence ×
    ``HEADROOM``, at least ``BYTES_FLOOR``), written in its spec for its fetch, which
    holds it under the bot host's ceiling; 0: nothing to size it from."""
    expected = expected_evidence(forecast)
    return 0 if expected is None else _sized(expected[1])


def volume_caps(ceiling: FetchCaps, inputs: int,
                forecast: Mapping[str, Any] | None) -> tuple[FetchCaps, str]:
    """The volume's caps under the bot host's ``ceiling``, sized for its ``inputs`` and
    the evidence its pilot's forecast expects, and how they were sized."""
    caps = ceiling.for_inputs(inputs)
    expected = expected_evidence(forecast)
    if expected is None:
        return caps, ("files from the volume's inputs; bytes: the bot host's ceiling "
                      "(no evidence copy measured on the pilot)")
    files, size, basis = expected
    sized = caps.for_bytes(size)
    return sized, (f"files: {FILES_BASE:,} + {FILES_PER_INPUT} × {inputs:,} inputs; bytes: "
                   f"the expected evidence copy, {_gib(size)} ({files:,} files, the pilot's "
                   f"evidence scaled from {basis}) × {HEADROOM}, at least "
                   f"{_gib(BYTES_FLOOR)}; never above the bot host's "
                   f"{_gib(ceiling.total_bytes)}, {ceiling.files:,} files")


def over_ceiling(ceiling: FetchCaps, forecast: Mapping[str, Any] | None) -> str | None:
    """A sentence when the volume's expected evidence copy passes the bot host's fetch
    ceiling (its fetch would stop there, after the whole volume ran); None otherwise."""
    expected = expected_evidence(forecast)
    if expected is None:
        return None
    files, size, basis = expected
    over = []
    if size > ceiling.total_bytes:
        over.append(f"{_gib(size)} over its {_gib(ceiling.total_bytes)} "
                    "(PREFLIGHT_FETCH_MAX_BYTES)")
    if files > ceiling.files:
        over.append(f"{files:,} files over its {ceiling.files:,} (PREFLIGHT_FETCH_MAX_FILES)")
    if not over:
        return None
    return (f"The volume's evidence copy is expected at {_gib(size)} in {files:,} files (the "
            f"pilot's evidence scaled from {basis}): {' and '.join(over)} of this bot's fetch "
            "ceiling. Its fetch would stop at the ceiling once the volume has run: raise "
            "the setting on the bot host, or bring less back (volume.outputs_on_nodes, "
            "smaller outputs) before approving")


def with_fetch_caps(fc: dict[str, Any], ceiling: FetchCaps, inputs: int) -> dict[str, Any]:
    """The pilot's stored forecast ``fc`` with the volume's fetch caps as a figure
    ("Results fetch (caps)", sized, with how) and, when its expected evidence passes the
    bot host's ``ceiling``, a note saying so before the approval. Only where the forecast
    has a fetch (an SSH head): a local volume's results are not fetched."""
    if not fc.get("possible") or "fetch_s" not in fc:
        return fc
    caps, how = volume_caps(ceiling, inputs, fc)
    figure = {"key": "fetch_caps", "label": "Results fetch (caps)", "value": caps.words(),
              "formula": how}
    over = over_ceiling(ceiling, fc)
    return {**fc, "figures": [*(fc.get("figures") or []), figure],
            "notes": [*(fc.get("notes") or []), *([over] if over else [])],
            "fetch_over_ceiling": over is not None}
