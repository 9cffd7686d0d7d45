"""One card's facts in the one shape every vendor source produces (nvidia-smi, NVML,
amd-smi, rocm-smi), read by ``runner.cards``. Standard library only."""

from __future__ import annotations

from typing import Any, Dict, List, Optional

# NVML's clocks-throttle-reason bits (nvmlClocksThrottleReason*), by value.
THROTTLE_BITS = (
    (0x1, "gpu_idle"), (0x2, "applications_clocks_setting"), (0x4, "sw_power_cap"),
    (0x8, "hw_slowdown"), (0x10, "sync_boost"), (0x20, "sw_thermal_slowdown"),
    (0x40, "hw_thermal_slowdown"), (0x80, "hw_power_brake_slowdown"),
    (0x100, "display_clock_setting"),
)


def bus_id(raw: Any) -> Optional[str]:
    """``00000000:9B:00.0`` (nvidia-smi, NVML) -> ``0000:9b:00.0`` (what lspci prints)."""
    if isinstance(raw, bytes):
        raw = raw.decode("ascii", "replace")
    text = str(raw or "").strip().lower()
    if not text or text in ("n/a", "[n/a]"):
        return None
    parts = text.split(":")
    if len(parts) == 3 and len(parts[0]) > 4:
        parts[0] = parts[0][-4:]
    return ":".join(parts)


def throttle_names(mask: Any) -> List[str]:
    """The active reasons of a throttle bitmask (an int or ``0x…`` text), idle left out."""
    try:
        value = int(mask, 16) if isinstance(mask, str) else int(mask)
    except (TypeError, ValueError):
        return []
    return [name for bit, name in THROTTLE_BITS if value & bit and name != "gpu_idle"]


def card_row(index: Optional[int], **fields: Any) -> Dict[str, Any]:
    """One card's facts in the shape every source produces (runner.cards reads it)."""
    row: Dict[str, Any] = {
        "index": index, "uuid": fields.get("uuid"), "name": fields.get("name"),
        "bus_id": bus_id(fields.get("bus_id")), "memory_mib": fields.get("memory_mib"),
        "memory_free_mib": fields.get("memory_free_mib"),
        "pcie": {k: fields.get(k) for k in ("gen_current", "gen_max", "width_current",
                                            "width_max")},
        "temperature_c": fields.get("temperature_c"),
        "throttle_reasons": list(fields.get("throttle_reasons") or []),
        "ecc_volatile_uncorrected": fields.get("ecc_volatile_uncorrected"),
        "rows_pending": fields.get("rows_pending"),
        "row_remap_failure": fields.get("row_remap_failure"),
    }
    for key in ("capability", "gfx_arch"):
        if fields.get(key) is not None:
            row[key] = fields[key]
    return row
