"""The simulated cluster's node: a ``python`` that shows K cards.

:func:`node_python` writes an executable wrapper around this interpreter: the node's
cards (``PREFLIGHT_SIM_CARDS``, rows of the recorded ``nvidia-smi`` output), the fake
``nvidia-smi`` first on ``PATH`` and the torch shim first on ``PYTHONPATH``, then the real
interpreter. Give it as a node's ``python`` (a manifest's ``node.python``, the runner's
interpreter in a test): everything that python starts (the watchdog's worker, the
interconnect's processes, ``ray start`` and Ray's workers) inherits the same cards.
What is real and what is simulated: docs/volume.md, "What the test kit simulates".
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

KIT = Path(__file__).resolve().parent
SHIM = KIT / "shim"
BIN = KIT / "bin"


def node_python(where: Path, cards: int, python: str = sys.executable) -> Path:
    """An executable at ``where`` that runs ``python`` as a node with ``cards`` cards."""
    where.parent.mkdir(parents=True, exist_ok=True)
    where.write_text(
        "#!/bin/sh\n"
        f"export PREFLIGHT_SIM_CARDS={int(cards)}\n"
        f"export PATH={shlex.quote(str(BIN))}:\"$PATH\"\n"
        f"export PYTHONPATH={shlex.quote(str(SHIM))}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        f"exec {shlex.quote(python)} \"$@\"\n", encoding="utf-8")
    os.chmod(where, 0o755)
    return where
