"""What changed between two attempts of a pilot: one factor at a time.

A manifest submitted again under the same name is a new attempt. The guide's rule is to
change one factor at a time, so the plan lists the changes field by field and warns when
several factors moved at once. The same diff applies to the environment facts two runs
recorded (interpreter, torch build, driver...), ignoring what changes on every run.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

ADDED = "added"
REMOVED = "removed"
CHANGED = "changed"
SET = "set"  # a set of plain values: ``old`` what disappeared, ``new`` what appeared
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[T ]\d{2}:\d{2}(?::\d{2}(?:\.\d+)?)?"
                        r"(?:Z|[+-]\d{2}:?\d{2})?")

# Fields that do not change what the pilot does: a new price or approver is not a factor.
NOT_A_FACTOR = ("approvals", "lease", "hardware.days", "hardware.lots",
                "hardware.lot_price_usd_per_day", "hardware.memory_estimate_gib",
                "results", "name", "apiVersion", "api_version", "node.stall_after_s",
                "success")
# Facts that differ on every run (timings, ids, measured rates) are not changes.
_VOLATILE = re.compile(r"(^|_)(ts|at|time|seconds|duration|elapsed|pid|ms|s|run|run_id|"
                       r"tflops|gbps|per_s|free_gib|free_mib|free_bytes|peak_gib|peak_bytes|"
                       r"temperature_c|ratio_to_peers|peers_median|fraction|"
                       # a run's own Ray session, a timing loop's count, the evidence's
                       # size, the process's memory and the disk's free space as measured
                       r"session|iterations|bytes|rss_gib|rss_before_gib|rss_after_gib|"
                       r"disk_gib)$")


@dataclass(frozen=True)
class Change:
    path: str
    old: Any
    new: Any
    kind: str = CHANGED

    def __str__(self) -> str:
        if self.kind == ADDED:
            return f"{self.path}: added {_show(self.new)}"
        if self.kind == REMOVED:
            return f"{self.path}: removed (was {_show(self.old)})"
        if self.kind == SET:
            parts = ([f"removed {', '.join(map(str, self.old))}"] if self.old else []) + \
                    ([f"added {', '.join(map(str, self.new))}"] if self.new else [])
            return f"{self.path}: {'; '.join(parts)}"
        return f"{self.path}: {_show(self.old)} -> {_show(self.new)}"

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "old": self.old, "new": self.new, "kind": self.kind}


def diff_manifests(old: dict[str, Any], new: dict[str, Any]) -> list[Change]:
    """Field-by-field changes between two manifests (as JSON data), sorted by path.

    Lists are compared whole (``task.categories: [a, b] -> [a, c]``); equal amounts
    written differently (``2.5`` and ``"2.50"``) are not a change.
    """
    return sorted(_diff(old, new, "", sets=False, ignore=None), key=lambda c: c.path)


def diff_facts(old_env: dict[str, Any], new_env: dict[str, Any],
               run_ids: tuple[str, str] = ("", "")) -> list[Change]:
    """Changes between two runs' environment facts, leaving out per-run noise: keys that
    change every run, and values that differ only by the run's own id or a timestamp.

    Lists of plain values (installed packages) are compared as sets (kind ``set``):
    ``old`` holds what disappeared and ``new`` what appeared.
    """
    old_env, new_env = _quiet(old_env, run_ids[0]), _quiet(new_env, run_ids[1])
    return sorted(_diff(old_env, new_env, "", sets=True, ignore=_VOLATILE),
                  key=lambda c: c.path)


def _quiet(value: Any, run_id: str) -> Any:
    """``value`` with its run's id and every timestamp replaced by placeholders."""
    if isinstance(value, dict):
        return {k: _quiet(v, run_id) for k, v in value.items()}
    if isinstance(value, list):
        return [_quiet(v, run_id) for v in value]
    if isinstance(value, str):
        text = value.replace(run_id, "<run>") if run_id else value
        return _TIMESTAMP.sub("<time>", text)
    return value


def factors(changes: list[Change]) -> list[str]:
    """The changed paths that alter what the pilot does (price, approvers... are not)."""
    return [c.path for c in changes if not _under(c.path, NOT_A_FACTOR)]


def one_factor_warning(changes: list[Change]) -> str | None:
    """A warning when more than one factor changed since the previous attempt."""
    moved = factors(changes)
    if len(moved) <= 1:
        return None
    return (f"{len(moved)} factors changed at once ({', '.join(moved)}): change one factor "
            "at a time, or a failure cannot be traced to its cause")


def _under(path: str, prefixes: tuple[str, ...]) -> bool:
    return any(path == p or path.startswith(p + ".") or path.startswith(p + "[")
               for p in prefixes)


def _diff(old: Any, new: Any, path: str, *, sets: bool,
          ignore: re.Pattern[str] | None) -> list[Change]:
    if isinstance(old, dict) and isinstance(new, dict):
        changes: list[Change] = []
        for key in sorted(set(old) | set(new), key=str):
            if ignore is not None and ignore.search(str(key)):
                continue
            sub = f"{path}.{key}" if path else str(key)
            if key not in old:
                changes.append(Change(sub, None, new[key], ADDED))
            elif key not in new:
                changes.append(Change(sub, old[key], None, REMOVED))
            else:
                changes += _diff(old[key], new[key], sub, sets=sets, ignore=ignore)
        return changes
    if sets and isinstance(old, list) and isinstance(new, list) and _plain(old) and _plain(new):
        gone = sorted(set(old) - set(new), key=str)
        came = sorted(set(new) - set(old), key=str)
        return [Change(path, gone, came, SET)] if gone or came else []
    return [] if _same(old, new) else [Change(path, old, new)]


def _plain(values: list[Any]) -> bool:
    return all(isinstance(v, (str, int, float, bool)) or v is None for v in values)


def _same(old: Any, new: Any) -> bool:
    if isinstance(old, bool) or isinstance(new, bool):
        return type(old) is type(new) and bool(old == new)
    if type(old) is type(new) and old == new:
        return True
    try:
        return _number(old) == _number(new)
    except (InvalidOperation, TypeError, ValueError):
        return False


def _number(value: Any) -> Decimal:
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    if isinstance(value, str) and re.fullmatch(r"-?\d+(\.\d+)?", value.strip()):
        return Decimal(value.strip())
    raise ValueError(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
