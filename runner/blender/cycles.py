"""Cycles' view of the node: the compute backends this Blender offers and the devices
under each, read by a small script run inside Blender, and the choice of the device a
render uses.

The probe uses Blender's documented Python API (``bpy.context.preferences.addons
["cycles"].preferences``: ``compute_device_type``, ``get_devices_for_type``, ``devices``
with ``name``/``type``/``id``) and prints one line, ``PREFLIGHT_CYCLES {json}``, which
``parse_probe`` reads back out of Blender's whole output. Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

MARKER = "PREFLIGHT_CYCLES "
GPU_BACKENDS: Tuple[str, ...] = ("CUDA", "OPTIX", "HIP", "ONEAPI", "METAL")
# What each manifest backend may render on, best first.
FOR_BACKEND: Dict[str, Tuple[str, ...]] = {"cuda": ("OPTIX", "CUDA"), "rocm": ("HIP",),
                                           "cpu": ("CPU",)}

PROBE = r"""
import json, sys
out = {"blender": None, "offered": [], "backends": {}, "cpu": [], "errors": []}
try:
    import bpy
    out["blender"] = bpy.app.version_string
    prefs = bpy.context.preferences.addons["cycles"].preferences
except Exception as exc:
    out["errors"].append("cycles: %s: %s" % (type(exc).__name__, exc))
    prefs = None
if prefs is not None:
    for kind in ("CUDA", "OPTIX", "HIP", "ONEAPI", "METAL"):
        try:
            prefs.compute_device_type = kind
        except TypeError:
            continue  # this Blender was built without that backend
        out["offered"].append(kind)
        try:
            found = prefs.get_devices_for_type(kind)
        except Exception as exc:
            out["errors"].append("%s: %s: %s" % (kind, type(exc).__name__, exc))
            continue
        out["backends"][kind] = [{"name": d.name, "id": d.id} for d in found if d.type == kind]
    try:
        prefs.compute_device_type = "NONE"
        prefs.refresh_devices()
        out["cpu"] = [d.name for d in prefs.devices if d.type == "CPU"]
    except Exception as exc:
        out["errors"].append("CPU: %s: %s" % (type(exc).__name__, exc))
sys.stdout.write("PREFLIGHT_CYCLES " + json.dumps(out) + "\n")
sys.stdout.flush()
"""


class ProbeError(ValueError):
    """Blender's output holds no readable probe line."""


@dataclass(frozen=True)
class CyclesView:
    """What Cycles sees: ``backends`` maps each offered backend to its devices."""

    blender: Optional[str]
    offered: List[str]
    backends: Dict[str, List[Dict[str, str]]]
    cpu: List[str]
    errors: List[str] = field(default_factory=list)

    def devices(self, kind: str) -> List[Dict[str, str]]:
        if kind == "CPU":
            return [{"name": name, "id": "CPU"} for name in self.cpu]
        return list(self.backends.get(kind, []))

    def describe(self) -> str:
        """One line: every backend with its devices, as a person would read it."""
        parts = []
        for kind in self.offered:
            names = [d["name"] for d in self.backends.get(kind, [])]
            parts.append(f"{kind}: " + (", ".join(names) if names else "no device"))
        if not self.offered:
            parts.append("no GPU backend in this Blender build")
        parts.append("CPU: " + (", ".join(self.cpu) if self.cpu else "none listed"))
        return "; ".join(parts)

    def to_facts(self) -> Dict[str, Any]:
        return {"blender": self.blender, "offered": list(self.offered),
                "backends": {k: list(v) for k, v in self.backends.items()},
                "cpu": list(self.cpu), "errors": list(self.errors)}


def parse_probe(output: str) -> CyclesView:
    """The CyclesView in Blender's output (the last probe line wins); ProbeError naming
    what is wrong when there is none or it is not the expected shape."""
    line: Optional[str] = None
    for raw in output.splitlines():
        if raw.startswith(MARKER):
            line = raw[len(MARKER):]
    if line is None:
        raise ProbeError("Blender printed no Cycles probe line (the script did not run)")
    try:
        doc = json.loads(line)
    except ValueError as exc:
        raise ProbeError(f"the Cycles probe line is not JSON: {exc}") from exc
    if not isinstance(doc, dict):
        raise ProbeError("the Cycles probe line is not a JSON object")
    offered = [k for k in _strings(doc.get("offered")) if k in GPU_BACKENDS]
    backends: Dict[str, List[Dict[str, str]]] = {}
    found: Any = doc.get("backends")
    raw_backends: Dict[str, Any] = found if isinstance(found, dict) else {}
    for kind in offered:
        devices = raw_backends.get(kind) or []
        backends[kind] = [{"name": str(d.get("name", "?")), "id": str(d.get("id", ""))}
                          for d in devices if isinstance(d, dict)]
    version = doc.get("blender")
    return CyclesView(blender=version if isinstance(version, str) else None, offered=offered,
                      backends=backends, cpu=_strings(doc.get("cpu")),
                      errors=_strings(doc.get("errors")))


def _strings(value: Any) -> List[str]:
    return [str(v) for v in value] if isinstance(value, list) else []


class NoDevice(Exception):
    """The manifest's backend has no device in Cycles' view; the message says what is seen."""


def choose_device(view: CyclesView, backend: str, wanted: Optional[str] = None
                  ) -> Tuple[str, List[Dict[str, str]]]:
    """The Cycles device type a render uses and its devices.

    ``wanted`` (``blender.cycles_device``) forces one type; otherwise the manifest's
    ``backend`` decides: cuda renders on OptiX when Cycles offers it with devices, else
    CUDA; rocm on HIP; cpu on the CPU. NoDevice names everything Cycles does see.
    """
    kinds = (wanted.upper(),) if wanted else FOR_BACKEND.get(backend, ("CPU",))
    for kind in kinds:
        devices = view.devices(kind)
        if devices:
            return kind, devices
    asked = " or ".join("OptiX" if k == "OPTIX" else k for k in kinds)
    why = f"blender.cycles_device {wanted}" if wanted else f"backend {backend}"
    raise NoDevice(f"Cycles sees no {asked} device ({why}); it sees: {view.describe()}")
