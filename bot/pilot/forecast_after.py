"""What the volume pays after its items: the evidence copy (and, as they are measured, the
collection of outputs from other nodes and the fetch to the bot host), each from per-file
and per-byte rates the pilot measured on its own. Pure; docs/forecast.md."""

from __future__ import annotations

from typing import Any

from bot.pilot.forecast_setup import UPLOAD_BYTES_PER_S
from bot.pilot.forecast_stats import plural, secs
from bot.pilot.forecast_types import Figure, ForecastInputs


def after_items(inp: ForecastInputs, figures: list[Figure], numbers: dict[str, Any]) -> float:
    """What the volume pays after its items, each part from the pilot's own rates: the
    collection of outputs other nodes wrote, the evidence copy, the fetch to the bot host."""
    grown = _volume_files(inp)
    total = 0.0
    if grown is not None:
        files_v, bytes_v, out_files, out_bytes, basis = grown
        # the volume's expected evidence copy: what its fetch's caps are sized from
        # (bot/pilot/fetch_caps.py)
        numbers["evidence_files"], numbers["evidence_bytes"] = round(files_v), round(bytes_v)
        numbers["evidence_basis"] = basis
        total += _collection(inp, out_files, out_bytes, figures, numbers)
        total += _evidence(inp, files_v, bytes_v, basis, figures, numbers)
        total += _fetch(inp, files_v, bytes_v, figures, numbers)
    numbers["after_s"] = round(total, 3)
    return total


def _volume_files(inp: ForecastInputs) -> tuple[float, float, float, float, str] | None:
    """(the volume's evidence files and bytes, the outputs' files and bytes, how): the
    pilot's evidence + the volume's items × the calibration's outputs per item (else the
    pilot's evidence × items ÷ pilot items)."""
    if inp.evidence is None or inp.pilot_items < 1:
        return None
    _seconds, files, size = inp.evidence
    cal = inp.calibration
    if cal is not None and cal.skipped is None and cal.recorded:
        out_files = inp.volume_count * cal.output_files / cal.recorded
        out_bytes = inp.volume_count * cal.output_bytes / cal.recorded
        return (files + out_files, size + out_bytes, out_files, out_bytes,
                f"the calibration's {cal.output_files:,} output files for {cal.recorded:,} "
                "items")
    scale = inp.volume_count / inp.pilot_items
    return (files * scale, size * scale, files * scale, size * scale,
            f"the pilot's {inp.pilot_items:,} items")


def _rates(measured: tuple[float, int, int]) -> tuple[float, float]:
    seconds, files, size = measured
    return (seconds / files if files else 0.0), (seconds / size if size else 0.0)


def _scaled(measured: tuple[float, int, int], files_v: float, bytes_v: float
            ) -> tuple[float, str]:
    """``measured`` (seconds, files, bytes) scaled to ``files_v`` and ``bytes_v`` by what
    grows faster: the larger of its per-file and its per-byte rate."""
    per_file, per_byte = _rates(measured)
    seconds, files, size = measured
    return max(files_v * per_file, bytes_v * per_byte), (
        f"the larger of {files_v:,.0f} files × {per_file * 1000:.3g} ms and {bytes_v:,.0f} B "
        f"× {per_byte * 1e6:.3g} s/MB (measured: {files:,} files, {size:,} B in "
        f"{secs(seconds)})")


def _evidence(inp: ForecastInputs, files_v: float, bytes_v: float, basis: str,
              figures: list[Figure], numbers: dict[str, Any]) -> float:
    """The volume's evidence copy, scaled from the pilot's own evidence copy."""
    assert inp.evidence is not None
    total, how = _scaled(inp.evidence, files_v, bytes_v)
    how = how.replace("measured", "the pilot's copy")
    figures.append(Figure("evidence", "Evidence copy", secs(total),
                          f"{how}; the volume's scaled from {basis}"))
    numbers["evidence_s"] = round(total, 3)
    return total


def _fetch(inp: ForecastInputs, files_v: float, bytes_v: float, figures: list[Figure],
           numbers: dict[str, Any]) -> float:
    """The bot's fetch of the volume's run directory and evidence (an SSH head), at the
    rates of the pilot's own fetch; not measured: said, and counted at the upload's rate."""
    if not inp.setup.ssh:
        return 0.0
    if inp.fetch is not None and inp.fetch[0] > 0:
        total, how = _scaled(inp.fetch, files_v, bytes_v)
        how = how.replace("measured", "the pilot's own fetch")
    else:
        total = bytes_v / UPLOAD_BYTES_PER_S
        how = (f"{bytes_v:,.0f} B ÷ {UPLOAD_BYTES_PER_S / 1e6:g} MB/s (estimated: the "
               "pilot's fetch was not measured)")
    figures.append(Figure("fetch", "Fetch to the bot host", secs(total), how))
    numbers["fetch_s"] = round(total, 3)
    return total


def _collection(inp: ForecastInputs, out_files: float, out_bytes: float,
                figures: list[Figure], numbers: dict[str, Any]) -> float:
    """The outputs the other nodes' workers wrote, collected to the head: their share of
    the outputs ((nodes − 1) ÷ nodes) at the rates of a ``collect`` stage the run measured,
    else (estimated, said so) at those of the pilot's fetch (a node's files sent over the
    network); none with one node or ``volume.outputs_on_nodes``."""
    nodes = max(1, inp.nodes)
    if nodes < 2:
        return 0.0
    if inp.outputs_on_nodes:
        figures.append(Figure("collection", "Output collection", "0 s",
                              "volume.outputs_on_nodes: the outputs stay on the nodes that "
                              "wrote them (the head keeps their lists)"))
        numbers["collection_s"] = 0.0
        return 0.0
    share = (nodes - 1) / nodes
    files_o, bytes_o = out_files * share, out_bytes * share
    if inp.collect is not None and inp.collect[0] > 0 and inp.collect[1] > 0:
        total, how = _scaled(inp.collect, files_o, bytes_o)
        how = how.replace("measured", "the run's own collect stage, measured")
    elif inp.fetch is not None and inp.fetch[0] > 0:
        total, how = _scaled(inp.fetch, files_o, bytes_o)
        how = how.replace("measured", "estimated: no collection measured, the pilot's own "
                                      "fetch")
    else:
        total = bytes_o / UPLOAD_BYTES_PER_S
        how = (f"{bytes_o:,.0f} B ÷ {UPLOAD_BYTES_PER_S / 1e6:g} MB/s (estimated: no fetch "
               "measured)")
    figures.append(Figure("collection", "Output collection", secs(total),
                          f"the outputs of the {plural(nodes - 1, 'other node')} "
                          f"({nodes - 1} ÷ {nodes} of them): {how}"))
    numbers["collection_s"] = round(total, 3)
    return total
