"""Driver facts from nvidia-smi / rocm-smi / amd-smi when they are on PATH (never required)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from typing import Any, Dict, List, Optional

from runner.stages.cardrow import bus_id, card_row, throttle_names

NVIDIA_QUERY = "name,driver_version,memory.total,uuid,pci.bus_id"


def run_tool(argv: List[str], timeout: float = 15.0) -> Optional[str]:
    """The tool's stdout, or None when it is absent, fails or hangs."""
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def parse_nvidia_smi(text: str) -> List[Dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=NVIDIA_QUERY --format=csv,noheader,nounits``."""
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.split(",")]
        if len(cells) < 3 or not cells[0]:
            continue
        row: Dict[str, Any] = {"name": cells[0], "driver_version": cells[1]}
        try:
            row["memory_mib"] = int(float(cells[2]))
        except ValueError:
            row["memory_mib"] = None
        if len(cells) > 3:
            row["uuid"] = cells[3]
        if len(cells) > 4:
            row["pci_bus_id"] = cells[4]
        rows.append(row)
    return rows


def parse_cuda_version(text: str) -> Optional[str]:
    """The "CUDA Version: 12.4" the driver supports, from plain ``nvidia-smi`` output."""
    marker = "CUDA Version:"
    at = text.find(marker)
    if at < 0:
        return None
    return text[at + len(marker):].split()[0].strip("|") or None


def parse_rocm_smi(text: str) -> Dict[str, Any]:
    """``rocm-smi --showdriverversion --showproductname --json`` -> driver and card names."""
    try:
        doc = json.loads(text)
    except ValueError:
        return {}
    facts: Dict[str, Any] = {"cards": []}
    for key, value in doc.items():
        if not isinstance(value, dict):
            continue
        if key.lower() == "system":
            facts["driver_version"] = value.get("Driver version")
            continue
        facts["cards"].append({"card": key,
                               "name": value.get("Card series") or value.get("Card SKU"),
                               "gfx": value.get("GFX Version")})
    return facts


def driver_facts(backend: str) -> Dict[str, Any]:
    """What the vendor tool says, or {"tool": None} when none is available."""
    if backend == "cuda":
        out = run_tool(["nvidia-smi", f"--query-gpu={NVIDIA_QUERY}",
                        "--format=csv,noheader,nounits"])
        if out is None:
            return {"tool": None}
        facts: Dict[str, Any] = {"tool": "nvidia-smi", "gpus": parse_nvidia_smi(out)}
        plain = run_tool(["nvidia-smi"])
        facts["driver_cuda_version"] = parse_cuda_version(plain or "")
        if facts["gpus"]:
            facts["driver_version"] = facts["gpus"][0]["driver_version"]
        return facts
    if backend == "rocm":
        out = run_tool(["rocm-smi", "--showdriverversion", "--showproductname", "--json"])
        if out is not None:
            return {"tool": "rocm-smi", **parse_rocm_smi(out)}
        out = run_tool(["amd-smi", "static", "--json"])
        if out is not None:
            return {"tool": "amd-smi", "raw_bytes": len(out)}
    return {"tool": None}


# ------------------------------------------------------------------ every card, in detail

# One row per card; the order of these fields is the order of the CSV cells.
NVIDIA_CARD_FIELDS = (
    ("index", "index"), ("uuid", "uuid"), ("name", "name"), ("bus_id", "pci.bus_id"),
    ("memory_mib", "memory.total"), ("memory_free_mib", "memory.free"),
    ("capability", "compute_cap"), ("gen_current", "pcie.link.gen.current"),
    ("gen_max", "pcie.link.gen.max"), ("width_current", "pcie.link.width.current"),
    ("width_max", "pcie.link.width.max"), ("temperature_c", "temperature.gpu"),
    ("throttle", "clocks_throttle_reasons.active"),
    ("ecc_volatile_uncorrected", "ecc.errors.uncorrected.volatile.total"),
    ("retired_pending", "retired_pages.pending"),
)
NVIDIA_REMAP_QUERY = "gpu_bus_id,remapped_rows.pending,remapped_rows.failure"

XID_LINE = re.compile(r"NVRM: Xid \(PCI:([0-9a-fA-F:.]+)\): (\d+),(.*)")


def _cell(text: str) -> Optional[str]:
    text = text.strip()
    return None if not text or text.strip("[]").lower() in ("n/a", "not supported",
                                                               "unknown error") else text


def _int_cell(text: Optional[str]) -> Optional[int]:
    try:
        return int(float(text)) if text is not None else None
    except ValueError:
        return None


def parse_nvidia_cards(text: str, remap: str = "") -> List[Dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<NVIDIA_CARD_FIELDS> --format=csv,noheader,nounits``,
    with ``--query-remapped-rows`` output (A100 and later) joined on the bus id."""
    remapped = parse_nvidia_remap(remap)
    rows = []
    for line in text.splitlines():
        cells = [_cell(c) for c in line.split(",")]
        if len(cells) != len(NVIDIA_CARD_FIELDS):
            continue
        raw = {key: cells[i] for i, (key, _) in enumerate(NVIDIA_CARD_FIELDS)}
        ints = {k: _int_cell(raw[k]) for k in (
            "memory_mib", "memory_free_mib", "gen_current", "gen_max", "width_current",
            "width_max", "temperature_c", "ecc_volatile_uncorrected")}
        pending = 1 if (raw["retired_pending"] or "").lower() == "yes" else (
            0 if raw["retired_pending"] else None)
        row = card_row(_int_cell(raw["index"]), uuid=raw["uuid"], name=raw["name"],
                       bus_id=raw["bus_id"], capability=raw["capability"],
                       throttle_reasons=throttle_names(raw["throttle"]),
                       rows_pending=pending, **ints)
        extra = remapped.get(row["bus_id"] or "")
        if extra:
            row["rows_pending"] = max(row["rows_pending"] or 0, extra["pending"] or 0)
            row["row_remap_failure"] = extra["failure"]
        rows.append(row)
    return rows


def parse_nvidia_remap(text: str) -> Dict[str, Dict[str, Any]]:
    """``--query-remapped-rows=NVIDIA_REMAP_QUERY --format=csv,noheader,nounits`` by bus id."""
    out: Dict[str, Dict[str, Any]] = {}
    for line in text.splitlines():
        cells = [_cell(c) for c in line.split(",")]
        if len(cells) != 3 or not cells[0]:
            continue
        pending = _int_cell(cells[1]) if (cells[1] or "").isdigit() else (
            1 if (cells[1] or "").lower() == "yes" else 0 if cells[1] else None)
        failure = None if cells[2] is None else cells[2].lower() in ("yes", "1")
        out[bus_id(cells[0]) or ""] = {"pending": pending, "failure": failure}
    return out


def parse_xid(text: str) -> Dict[str, List[Dict[str, Any]]]:
    """Xid errors of a kernel log (``dmesg``), by bus id prefix (``0000:9b:00``)."""
    out: Dict[str, List[Dict[str, Any]]] = {}
    for line in text.splitlines():
        found = XID_LINE.search(line)
        if not found:
            continue
        where = bus_id(found.group(1)) or found.group(1)
        detail = found.group(3).strip()
        out.setdefault(where, []).append({"code": int(found.group(2)),
                                          "detail": detail[:200]})
    return out


def attach_xid(cards: List[Dict[str, Any]], xid: Dict[str, List[Dict[str, Any]]]) -> None:
    """Give each card the Xid errors whose PCI address is a prefix of its bus id."""
    for card in cards:
        bus = card.get("bus_id") or ""
        card["xid"] = [e for where, events in xid.items() if bus and bus.startswith(where)
                       for e in events]


def parse_amd_cards(static: str, metric: str = "") -> List[Dict[str, Any]]:
    """``amd-smi static --json`` (and ``amd-smi metric --json``) -> card rows."""
    cards = _amd_list(static)
    metrics = {_amd_index(m): m for m in _amd_list(metric)}
    rows = []
    for card in cards:
        index = _amd_index(card)
        asic, bus = card.get("asic") or {}, card.get("bus") or {}
        met = metrics.get(index, {})
        pcie = met.get("pcie") or {}
        ecc = met.get("ecc") or {}
        rows.append(card_row(
            index, uuid=asic.get("asic_serial") or card.get("uuid"),
            name=asic.get("market_name"), bus_id=bus.get("bdf"),
            gfx_arch=asic.get("target_graphics_version"),
            memory_mib=_amd_number((card.get("vram") or {}).get("size")),
            gen_current=_amd_gen(pcie.get("speed")), gen_max=_amd_gen(bus.get("max_pcie_speed")),
            width_current=_amd_number(pcie.get("width")),
            width_max=_amd_number(bus.get("max_pcie_width")),
            temperature_c=_amd_number((met.get("temperature") or {}).get("hotspot")),
            ecc_volatile_uncorrected=_amd_number(ecc.get("total_uncorrectable_count"))))
    return rows


def _amd_list(text: str) -> List[Dict[str, Any]]:
    try:
        doc = json.loads(text) if text.strip() else []
    except ValueError:
        return []
    if isinstance(doc, dict):  # amd-smi >= 24.7 wraps the list: {"gpu_data": [...]}
        doc = doc.get("gpu_data", [])
    return [c for c in doc if isinstance(c, dict)] if isinstance(doc, list) else []


def _amd_index(card: Dict[str, Any]) -> Optional[int]:
    return _amd_number(card.get("gpu"))


def _amd_number(value: Any) -> Optional[int]:
    """``16``, ``"16"``, ``"196592 MB"`` or ``{"value": 196592, "unit": "MB"}`` -> int."""
    if isinstance(value, dict):
        value = value.get("value")
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, (int, float)):
        return int(value)
    head = str(value).strip().split(" ")[0]
    return _int_cell(head)


def _amd_gen(speed: Any) -> Optional[int]:
    """PCIe generation from a link speed in GT/s (2.5, 5, 8, 16, 32, 64)."""
    gts = {2: 1, 5: 2, 8: 3, 16: 4, 32: 5, 64: 6}
    if isinstance(speed, dict):
        speed = speed.get("value")
    try:
        value = float(str(speed).split(" ")[0])
    except ValueError:
        return None
    return gts.get(int(value))


ROCM_SMI_CARDS = ["rocm-smi", "--showbus", "--showuniqueid", "--showproductname",
                  "--showmeminfo", "vram", "--showtemp", "--json"]


def parse_rocm_smi_cards(text: str) -> List[Dict[str, Any]]:
    """``rocm-smi ROCM_SMI_CARDS --json`` (older ROCm, no amd-smi) -> card rows.

    rocm-smi reports no PCIe width nor ECC counts in this form: those stay unknown.
    """
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    rows = []
    for key, card in doc.items() if isinstance(doc, dict) else ():
        found = re.fullmatch(r"card(\d+)", str(key))
        if not found or not isinstance(card, dict):
            continue
        vram = _int_cell(card.get("VRAM Total Memory (B)"))
        temps = [_int_cell(str(v)) for k, v in sorted(
            card.items(), key=lambda kv: "junction" not in str(kv[0]))
            if str(k).startswith("Temperature")]  # the junction sensor first, N/A left out
        temps = [t for t in temps if t is not None]
        rows.append(card_row(
            int(found.group(1)), uuid=card.get("Unique ID"), bus_id=card.get("PCI Bus"),
            name=card.get("Card Series") or card.get("Card series"),
            gfx_arch=card.get("GFX Version"),
            memory_mib=vram // 2 ** 20 if vram is not None else None,
            temperature_c=temps[0] if temps else None))
    return rows


def card_facts(backend: str) -> Dict[str, Any]:
    """Every card as the vendor sees it: ``{"source": ..., "cards": [...]}``.

    NVIDIA: NVML (nvidia-ml-py, imported here) when importable, else nvidia-smi. AMD:
    amd-smi, else rocm-smi. ``source`` is None when no source answered; ``xid`` is
    attached on NVIDIA when the kernel log is readable (``xid_source`` says whether it was).
    """
    facts: Dict[str, Any] = {"source": None, "cards": []}
    if backend == "cuda":
        from runner.stages.nvml import nvml_cards

        cards, why = nvml_cards()
        if cards is not None:
            facts.update(source="nvml", cards=cards)
        else:
            facts["nvml"] = why
            out = run_tool(["nvidia-smi", "--query-gpu=" + ",".join(
                q for _, q in NVIDIA_CARD_FIELDS), "--format=csv,noheader,nounits"])
            if out is not None:
                remap = run_tool(["nvidia-smi", f"--query-remapped-rows={NVIDIA_REMAP_QUERY}",
                                  "--format=csv,noheader,nounits"])
                facts.update(source="nvidia-smi", cards=parse_nvidia_cards(out, remap or ""))
        log = run_tool(["dmesg"])
        facts["xid_source"] = "dmesg" if log is not None else None
        attach_xid(facts["cards"], parse_xid(log or ""))
    elif backend == "rocm":
        static = run_tool(["amd-smi", "static", "--json"])
        if static is not None:
            metric = run_tool(["amd-smi", "metric", "--json"]) or ""
            facts.update(source="amd-smi", cards=parse_amd_cards(static, metric))
        else:
            out = run_tool(ROCM_SMI_CARDS)
            if out is not None:
                facts.update(source="rocm-smi", cards=parse_rocm_smi_cards(out))
    return facts
