"""Frames as inputs: ``inputs.frames`` ("1-24", "1-24x2", "1,5,9" or a list) of .blend files.

Each frame of each file is one input id, ``<file name>#<frame, 4 digits>``
(``shot01.blend#0007``): the file name keeps its extension so two shots never collide,
and the zero padding makes ids sort in frame order. Part of the bot/runner contract
(the bot lists the same ids to expect), so standard library only.
"""

from __future__ import annotations

import re
from typing import Any, List, Tuple

CATEGORY = "rendered"  # the category of every accepted frame
MAX_FRAME = 1_048_574  # Blender's MAXFRAME
MAX_FRAMES_PER_FILE = 100_000
_RANGE = re.compile(r"^\s*(-?\d+)\s*(?:-\s*(-?\d+)\s*(?:x\s*(\d+)\s*)?)?$")


class FramesError(ValueError):
    """``inputs.frames`` cannot be read; the message names the part that is wrong."""


def parse_frames(value: Any) -> List[int]:
    """The frame numbers of ``value``, sorted, each once.

    A string is comma-separated parts, each a frame ("7"), a range ("1-24", inclusive) or
    a range with a step ("1-24x4"); a list holds ints or such strings. A frame listed twice
    is an error (it would be one input counted twice), as is an empty selection.
    """
    parts: List[Any]
    if isinstance(value, bool):
        raise FramesError(f"expected a frame range such as \"1-24\" or a list, got {value!r}")
    if isinstance(value, int):
        parts = [value]
    elif isinstance(value, str):
        parts = [p for p in value.split(",")]
    elif isinstance(value, (list, tuple)):
        parts = list(value)
    else:
        raise FramesError(f"expected a frame range such as \"1-24\" or a list, "
                          f"got {type(value).__name__}")
    frames: List[int] = []
    for part in parts:
        frames.extend(_part(part))
    if not frames:
        raise FramesError("no frame selected")
    seen: set[int] = set()
    for frame in frames:
        if frame in seen:
            raise FramesError(f"frame {frame} is listed more than once")
        seen.add(frame)
    if len(frames) > MAX_FRAMES_PER_FILE:
        raise FramesError(f"{len(frames)} frames per file; at most {MAX_FRAMES_PER_FILE}")
    return sorted(frames)


def _part(part: Any) -> List[int]:
    if isinstance(part, bool) or not isinstance(part, (int, str)):
        raise FramesError(f"{part!r} is not a frame number or range")
    if isinstance(part, int):
        return [_frame(part)]
    match = _RANGE.match(part)
    if not match:
        raise FramesError(f"{part.strip()!r} is not a frame, a range \"1-24\" or a stepped "
                          f"range \"1-24x2\"")
    start = _frame(int(match.group(1)))
    if match.group(2) is None:
        return [start]
    end = _frame(int(match.group(2)))
    step = int(match.group(3) or 1)
    if end < start:
        raise FramesError(f"range {part.strip()!r} ends before it starts")
    if step < 1:
        raise FramesError(f"range {part.strip()!r}: the step must be at least 1")
    if (end - start) // step + 1 > MAX_FRAMES_PER_FILE:
        raise FramesError(f"range {part.strip()!r} has more than {MAX_FRAMES_PER_FILE} frames")
    return list(range(start, end + 1, step))


def _frame(number: int) -> int:
    if not -MAX_FRAME <= number <= MAX_FRAME:
        raise FramesError(f"frame {number} is outside Blender's range "
                          f"(-{MAX_FRAME}..{MAX_FRAME})")
    return number


def frame_id(blend_name: str, frame: int) -> str:
    """``shot01.blend`` and 7 -> ``shot01.blend#0007`` (negative frames: ``#-0007``)."""
    return f"{blend_name}#{frame:04d}" if frame >= 0 else f"{blend_name}#-{-frame:04d}"


def split_frame_id(iid: str) -> Tuple[str, int]:
    """``shot01.blend#0007`` -> (``shot01.blend``, 7); ValueError for any other shape."""
    name, sep, number = iid.rpartition("#")
    if not sep or not name or not re.fullmatch(r"-?\d{4,}", number):
        raise ValueError(f"{iid!r} is not a frame id (<file>.blend#<frame>)")
    return name, int(number)

