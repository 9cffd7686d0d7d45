"""Every NVIDIA card through NVML (the ``pynvml`` module of ``nvidia-ml-py``), when present.

``pynvml`` is imported inside ``nvml_cards``: the runner starts without it and the device
stage then falls back to nvidia-smi (runner.stages.smi). ``read_cards`` takes the module
as an argument so the tests can hand it a recorded card.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Tuple

from runner.stages.cardrow import card_row, throttle_names


def nvml_cards() -> Tuple[Optional[List[Dict[str, Any]]], Optional[str]]:
    """``(cards, None)`` from NVML, or ``(None, why)`` when NVML cannot be used."""
    try:
        import pynvml
    except Exception as exc:  # noqa: BLE001 - ImportError, or a broken install
        return None, f"nvidia-ml-py not importable ({type(exc).__name__})"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return None, f"nvmlInit failed: {exc}"
    try:
        return read_cards(pynvml), None
    finally:
        try:
            pynvml.nvmlShutdown()
        except Exception:  # noqa: BLE001, S110 - shutting down is best effort
            pass


def read_cards(nvml: Any) -> List[Dict[str, Any]]:
    """One row per card NVML counts (NVML order, which is PCI order)."""
    rows = []
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        rows.append(_read_card(nvml, index, handle))
    return rows


def _read_card(nvml: Any, index: int, handle: Any) -> Dict[str, Any]:
    def ask(fn: str, *args: Any) -> Any:
        return _ask(getattr(nvml, fn, None), handle, *args)

    memory = ask("nvmlDeviceGetMemoryInfo")
    pci = ask("nvmlDeviceGetPciInfo")
    cap = ask("nvmlDeviceGetCudaComputeCapability")
    remap = ask("nvmlDeviceGetRemappedRows")  # (correctable, uncorrectable, pending, failed)
    retired = ask("nvmlDeviceGetRetiredPagesPendingStatus")
    pending = None
    if isinstance(remap, (tuple, list)) and len(remap) >= 4:
        pending = int(bool(remap[2]))
    elif retired is not None:
        pending = int(bool(retired))
    return card_row(
        index, uuid=_text(ask("nvmlDeviceGetUUID")), name=_text(ask("nvmlDeviceGetName")),
        bus_id=_text(getattr(pci, "busId", None)),
        memory_mib=int(memory.total // 2 ** 20) if memory is not None else None,
        memory_free_mib=int(memory.free // 2 ** 20) if memory is not None else None,
        capability=f"{cap[0]}.{cap[1]}" if isinstance(cap, (tuple, list)) else None,
        gen_current=ask("nvmlDeviceGetCurrPcieLinkGeneration"),
        gen_max=ask("nvmlDeviceGetMaxPcieLinkGeneration"),
        width_current=ask("nvmlDeviceGetCurrPcieLinkWidth"),
        width_max=ask("nvmlDeviceGetMaxPcieLinkWidth"),
        temperature_c=ask("nvmlDeviceGetTemperature", getattr(nvml, "NVML_TEMPERATURE_GPU", 0)),
        throttle_reasons=throttle_names(ask("nvmlDeviceGetCurrentClocksEventReasons")
                                        or ask("nvmlDeviceGetCurrentClocksThrottleReasons") or 0),
        ecc_volatile_uncorrected=ask(
            "nvmlDeviceGetTotalEccErrors",
            getattr(nvml, "NVML_MEMORY_ERROR_TYPE_UNCORRECTED", 1),
            getattr(nvml, "NVML_VOLATILE_ECC", 0)),
        rows_pending=pending,
        row_remap_failure=bool(remap[3]) if isinstance(remap, (tuple, list))
        and len(remap) >= 4 else None)


def _ask(fn: Optional[Callable[..., Any]], *args: Any) -> Any:
    """One NVML query; None when the card or driver does not support it (NVMLError)."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:  # noqa: BLE001 - NVMLError_NotSupported and kin: the fact is unknown
        return None


def _text(value: Any) -> Optional[str]:
    if isinstance(value, bytes):  # older nvidia-ml-py returns bytes
        return value.decode("utf-8", "replace")
    return value if isinstance(value, str) else None
