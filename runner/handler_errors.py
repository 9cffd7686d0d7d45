"""Where a handler raised, kept: its file and line in the refusal, its traceback in the run
directory.

An input whose batch made the handler raise is refused alone with the exception as its
reason (``runner/volume_queue.py``); without the place it was raised, a team reading
``task.handler raised KeyError: 'x'`` in the balance had nothing to start from (no
traceback in the events, nor in ``runner.log``). ``where`` names the deepest frame of the
traceback (the line that raised), preferring the project's own code over a library's;
``keep`` appends the traceback to ``handler_errors.jsonl`` in the run directory, the first
``KEPT_MAX`` of them (a handler failing on every input does not fill the disk). Standard
library only.
"""

from __future__ import annotations

import json
import os
import traceback
from typing import Any, List, Optional

ERRORS_FILE = "handler_errors.jsonl"
KEPT_MAX = 200
TRACEBACK_CHARS = 8000


def where(exc: BaseException, project: Optional[str] = None) -> Optional[str]:
    """``file:line`` of the line that raised: the deepest frame under ``project`` when
    there is one, else the deepest frame; None without a traceback."""
    frames = traceback.extract_tb(exc.__traceback__)
    if not frames:
        return None
    root = os.path.abspath(project) + os.sep if project else None
    ours = [f for f in frames if root and os.path.abspath(f.filename).startswith(root)]
    frame = (ours or frames)[-1]
    return f"{frame.filename}:{frame.lineno}"


def formatted(exc: BaseException) -> str:
    """The traceback as Python prints it, its last ``TRACEBACK_CHARS`` characters."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return text[-TRACEBACK_CHARS:]


def keep(run_dir: str, ids: List[str], error: str, where_: Optional[str],
         trace: Optional[str], **extra: Any) -> bool:
    """Append one handler failure (the batch's ids, the error, where, the traceback) to the
    run directory's ``handler_errors.jsonl``; False once ``KEPT_MAX`` are kept or the file
    cannot be written (the refusal itself is recorded either way)."""
    path = os.path.join(run_dir, ERRORS_FILE)
    try:
        with open(path, "a+", encoding="utf-8") as fh:
            fh.seek(0)
            if sum(1 for _ in fh) >= KEPT_MAX:
                return False
            fh.write(json.dumps({"ids": ids[:50], "items": len(ids), "error": error,
                                 "where": where_, "traceback": trace, **extra},
                                sort_keys=True) + "\n")
    except OSError:
        return False
    return True
