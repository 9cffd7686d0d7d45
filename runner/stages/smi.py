"""Driver facts from nvidia-smi / rocm-smi / amd-smi when they are on PATH (never required)."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import Any, Dict, List, Optional

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
