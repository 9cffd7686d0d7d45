"""The simulated cards of one node: rows of a recorded ``nvidia-smi`` output.

Read by the fake ``nvidia-smi`` (``bin/nvidia-smi``) and by the torch shim
(``shim/torch``), so that both show the node the same cards. Standard library only: it is
loaded in processes that have not imported anything of ours.

The node's cards: the first ``PREFLIGHT_SIM_CARDS`` rows (default 8) of the recorded
output ``PREFLIGHT_SIM_SMI`` (default ``tests/runner/fixtures/cards/nvidia-smi-8xh100.csv``:
eight H100 80GB, ``--query-gpu=<runner.stages.smi.NVIDIA_CARD_FIELDS>``). That recording
holds two bad cards (card 3: ECC errors and a row pending remap; card 5: a degraded PCIe
link, hot and throttled). ``PREFLIGHT_SIM_FAULTS=recorded`` keeps them (a node with a bad
card); by default each card keeps its own identity (index, UUID, name, bus id, memory,
capability, temperature) and takes card 0's health cells (PCIe link, throttle, ECC,
retired pages, remapped rows): a healthy node.
"""

from __future__ import annotations

import os
from typing import Dict, List

RECORDED = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "runner", "fixtures", "cards", "nvidia-smi-8xh100.csv")
DRIVER_VERSION = "550.54.15"  # the recorded card rows carry no driver version
CUDA_VERSION = "12.4"
FIELDS = ("index", "uuid", "name", "bus_id", "memory_mib", "memory_free_mib", "capability")


def rows() -> List[List[str]]:
    """The node's card rows, as recorded (cells stripped), re-indexed 0..K-1."""
    path = os.environ.get("PREFLIGHT_SIM_SMI") or RECORDED
    with open(path, encoding="utf-8") as fh:
        lines = [[c.strip() for c in line.split(",")] for line in fh if line.strip()]
    count = int(os.environ.get("PREFLIGHT_SIM_CARDS", "8"))
    if count > len(lines):
        raise SystemExit(f"the recorded output {path} has {len(lines)} card(s), not {count}")
    out = [[str(i), *row[1:]] for i, row in enumerate(lines[:count])]
    if not recorded_faults():
        for row in out:
            row[7:11], row[12:] = out[0][7:11], out[0][12:]
    return out


def recorded_faults() -> bool:
    return os.environ.get("PREFLIGHT_SIM_FAULTS") == "recorded"


def remapped() -> List[str]:
    """``--query-remapped-rows`` lines: the recording's, or none pending."""
    if recorded_faults():
        path = os.path.join(os.path.dirname(RECORDED), "nvidia-smi-remapped-rows.csv")
        with open(path, encoding="utf-8") as fh:
            return [line.strip() for line in fh if line.strip()]
    return [f"{row[3]}, 0, 0" for row in rows()]


def cards() -> List[Dict[str, str]]:
    """Each card's first fields by name (what torch's device properties are made of)."""
    return [dict(zip(FIELDS, row)) for row in rows()]
