"""The most a run's results fetch may bring back from its node, sized for the run.

A fetch brings back the run's evidence copy (``bot/nodes/ssh/fetch.py``): its records,
its outputs as plain files up to 1,000 of them or packed in shards of up to 10,000
(``runner/evidence.py``), so the files it may hold follow from the run's inputs. The cap
on files is sized from them (``FILES_BASE`` + ``FILES_PER_INPUT`` per input: room for a
handler that writes a few files per input), never above the bot host's setting
(``PREFLIGHT_FETCH_MAX_FILES``). The byte caps are the settings' own
(``PREFLIGHT_FETCH_MAX_BYTES``, ``PREFLIGHT_FETCH_MAX_FILE_BYTES``): a manifest declares no
output size to size them from. The plan shows both, for the pilot and for the volume.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.settings import Settings

FILES_BASE = 1_000  # the run's own records, event lists, the shard index, a few shards
FILES_PER_INPUT = 4
GIB = 1 << 30


@dataclass(frozen=True)
class FetchCaps:
    """The caps of one run's fetch: ``files`` and ``total_bytes`` in all, ``file_bytes``
    for one file. The defaults are the settings' defaults."""

    total_bytes: int = 4 * GIB
    file_bytes: int = 2 * GIB
    files: int = 200_000

    def for_inputs(self, expected: int) -> FetchCaps:
        """These caps (the bot host's upper bounds) sized for a run of ``expected``
        inputs (0: unknown, the bounds as they are)."""
        if expected <= 0:
            return self
        files = min(self.files, FILES_BASE + FILES_PER_INPUT * expected)
        return FetchCaps(self.total_bytes, self.file_bytes, files)

    def words(self) -> str:
        return (f"up to {self.files:,} files, {_gib(self.total_bytes)} in all, "
                f"{_gib(self.file_bytes)} per file")


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def caps_of(settings: Settings) -> FetchCaps:
    """The bot host's upper bounds, from its settings."""
    return FetchCaps(settings.fetch_max_bytes, settings.fetch_max_file_bytes,
                     settings.fetch_max_files)
