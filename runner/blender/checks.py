"""What the ``environment`` stage checks for ``preparation: blender``: the executable, its
version, the add-ons, the licences. Standard library only.

Licences are checked for presence only: an environment variable is set (its value is
never read into a fact or a message), a file is readable (opened, not read), a
``host:port`` answers a TCP connection from the node.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
from typing import Any, Dict, List, Optional, Sequence, Tuple

ADDONS_MARKER = "PREFLIGHT_ADDONS "
ADDON_PROBE = r"""
import addon_utils, json, sys
names = {names!r}
known = {{m.__name__ for m in addon_utils.modules()}}
out = {{}}
for name in names:
    default, loaded = addon_utils.check(name)
    out[name] = {{"installed": name in known, "enabled": bool(loaded)}}
sys.stdout.write("PREFLIGHT_ADDONS " + json.dumps(out) + "\n")
sys.stdout.flush()
"""
_VERSION_LINE = re.compile(r"^Blender\s+(\d+\.\d+(?:\.\d+)?)", re.MULTILINE)
TCP_TIMEOUT_S = 3.0


class CheckError(Exception):
    """A check could not be made (Blender would not start, its output unreadable)."""


def find_executable(name: str) -> Optional[str]:
    """The absolute path of ``name`` (a bare name is looked up on PATH)."""
    if os.sep in name:
        return os.path.abspath(name) if os.access(name, os.X_OK) else None
    return shutil.which(name)


def run_capture(argv: Sequence[str], timeout: float) -> Tuple[int, str]:
    """Run a short Blender command; (exit code, stdout+stderr). CheckError on failure
    to start or on timeout."""
    try:
        proc = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=timeout, check=False)
    except subprocess.TimeoutExpired as exc:
        raise CheckError(f"{argv[0]} did not answer within {timeout:.0f} s") from exc
    except OSError as exc:
        raise CheckError(f"cannot start {argv[0]}: {exc.strerror or exc}") from exc
    return proc.returncode, proc.stdout.decode("utf-8", errors="replace")


def blender_version(exe: str, timeout: float = 120.0) -> str:
    """The version ``blender --version`` prints ("3.4.1")."""
    code, out = run_capture([exe, "-b", "--factory-startup", "-noaudio", "--version"],
                            timeout)
    match = _VERSION_LINE.search(out)
    if match is None:
        first = out.strip().splitlines()[0] if out.strip() else "(no output)"
        raise CheckError(f"{exe} --version printed no Blender version (exit {code}): "
                         f"{first[:200]}")
    return match.group(1)


def check_addons(exe: str, names: Sequence[str], timeout: float = 120.0
                 ) -> Dict[str, Dict[str, bool]]:
    """Each add-on: installed in this Blender, and enabled once asked with --addons."""
    script = ADDON_PROBE.format(names=list(names))
    _code, out = run_capture([exe, "-b", "--factory-startup", "-noaudio", "--addons",
                              ",".join(names), "--python-expr", script], timeout)
    for line in out.splitlines():
        if line.startswith(ADDONS_MARKER):
            try:
                doc = json.loads(line[len(ADDONS_MARKER):])
            except ValueError as exc:
                raise CheckError(f"the add-on probe line is not JSON: {exc}") from exc
            return {n: {"installed": bool(doc.get(n, {}).get("installed")),
                        "enabled": bool(doc.get(n, {}).get("enabled"))} for n in names}
    raise CheckError("Blender printed no add-on probe line: " + _last_line(out))


def _last_line(out: str) -> str:
    lines = [ln for ln in out.strip().splitlines() if ln.strip()]
    return lines[-1][:200] if lines else "(no output)"


def check_license(entry: Dict[str, Any]) -> Dict[str, Any]:
    """One licence requirement: ``{"env": NAME}``, ``{"file": PATH}`` or
    ``{"tcp": "host:port"}`` (optional ``name``). Returns a fact with ``ok`` and a
    ``detail`` that never contains a secret value."""
    label = str(entry.get("name") or "")
    if entry.get("env"):
        var = str(entry["env"])
        ok = bool(os.environ.get(var))
        return {"name": label or var, "kind": "env", "what": var, "ok": ok,
                "detail": "set" if ok else f"environment variable {var} is not set (or empty)"}
    if entry.get("file"):
        path = os.path.expanduser(str(entry["file"]))
        return {"name": label or path, "kind": "file", "what": path, **_readable(path)}
    if entry.get("tcp"):
        return {"name": label or str(entry["tcp"]), "kind": "tcp", "what": str(entry["tcp"]),
                **_answers(str(entry["tcp"]))}
    return {"name": label or "?", "kind": "unknown", "what": None, "ok": False,
            "detail": "expected one of env, file or tcp"}


def _readable(path: str) -> Dict[str, Any]:
    try:
        with open(path, "rb"):
            pass  # opened, never read: the content may be a secret
    except OSError as exc:
        return {"ok": False, "detail": f"{path} is not readable: {exc.strerror or exc}"}
    return {"ok": True, "detail": "readable"}


def _answers(address: str) -> Dict[str, Any]:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit():
        return {"ok": False, "detail": f"{address!r} is not host:port"}
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=TCP_TIMEOUT_S):
            pass
    except OSError as exc:
        return {"ok": False, "detail": f"{address} does not answer: {exc.strerror or exc}"}
    return {"ok": True, "detail": "answers"}


def describe_licenses(facts: List[Dict[str, Any]]) -> str:
    bad = [f for f in facts if not f["ok"]]
    return "licence check failed: " + "; ".join(f"{f['name']}: {f['detail']}" for f in bad)
