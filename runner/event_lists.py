"""Long lists in events: cut to ``LIST_CAP`` entries, the full list in a file of its own.

Part of the event contract (``runner.events`` re-exports every name here), so it stays
standard-library only.
"""

from __future__ import annotations

import json
import os
import re
from typing import Any, Dict, List, Optional

# Every list in an event's data (and in the objects it holds, ``facts`` included) holds at
# most LIST_CAP entries; a longer one is cut there, its full form written to
# ``event-lists/<seq>-<key>.json`` in the run directory, and the event names both:
# ``<key>_total`` (the full length) and ``<key>_file`` (that file, relative to the run
# directory) beside the cut list. ``list_total`` gives a reader the full length.
LIST_CAP = 200
LISTS_DIR = "event-lists"


def json_line(obj: Dict[str, Any]) -> str:
    """``obj`` as one line of JSON, keys sorted, valid UTF-8 whatever its strings hold."""
    line = json.dumps(obj, sort_keys=True, ensure_ascii=False) + "\n"
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:  # a lone surrogate (a file name that is not UTF-8)
        line = json.dumps(obj, sort_keys=True) + "\n"  # escaped: valid JSON and UTF-8
    return line


def list_total(data: Dict[str, Any], key: str) -> int:
    """How many entries ``data[key]`` had before the writer capped it (``LIST_CAP``)."""
    total = data.get(f"{key}_total")
    if isinstance(total, int) and not isinstance(total, bool):
        return total
    value = data.get(key)
    return len(value) if isinstance(value, list) else 0


def cap_lists(data: Dict[str, Any], seq: int, run_dir: str, *, cap: int = LIST_CAP,
              _prefix: str = "") -> Dict[str, Any]:
    """``data`` with each list longer than ``cap`` (in it, or in an object it holds) cut to
    its first ``cap`` entries, the full list written to ``LISTS_DIR/<seq>-<key>.json``
    under ``run_dir`` and named beside it (``<key>_total``, ``<key>_file``). ``data`` itself
    is not changed; it is returned as is when nothing was over. A file that cannot be
    written leaves ``<key>_file`` null and says why in ``<key>_file_error``: the run goes on."""
    out: Optional[Dict[str, Any]] = None
    for key, value in data.items():
        name = f"{_prefix}{key}"
        if isinstance(value, list) and len(value) > cap:
            rel = f"{LISTS_DIR}/{seq}-{re.sub(r'[^A-Za-z0-9_.-]', '_', name)[:120]}.json"
            new: Dict[str, Any] = {key: value[:cap], f"{key}_total": len(value),
                                   f"{key}_file": rel}
            try:
                _write_list(os.path.join(run_dir, rel), value)
            except (OSError, TypeError, ValueError) as exc:
                new[f"{key}_file"] = None
                new[f"{key}_file_error"] = f"{type(exc).__name__}: {exc}"
        elif isinstance(value, dict) and value:
            sub = cap_lists(value, seq, run_dir, cap=cap, _prefix=f"{name}.")
            if sub is value:
                continue
            new = {key: sub}
        else:
            continue
        if out is None:
            out = dict(data)
        out.update(new)
    return data if out is None else out


def _write_list(path: str, value: List[Any]) -> None:
    """The full list, durable before the event that names it (write, fsync, rename)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.tmp")  # not copied
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json_line({"list": value}).rstrip("\n") + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
