"""The pilot's inputs: one Item per file of ``spec.inputs.dir`` matching the pattern.

An item's id is its file name without the final extension (``doc-01.txt`` -> ``doc-01``),
the same rule the bot's manifest loader uses, so both sides agree on the ids to expect.
With ``inputs.frames`` (the Blender preparation) each file is a .blend and every frame of
it is one item, ``shot01.blend#0007`` (runner.frames), its path the .blend file.
"""

from __future__ import annotations

import fnmatch
import os
import stat
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from runner.errors import RunnerError
from runner.spec import RunSpec


class InputsError(RunnerError, ValueError):
    """The inputs directory cannot be listed, or two files map to the same id."""


@dataclass(frozen=True)
class Item:
    """One input. ``read()`` gives its bytes: from memory when a volume's worker read them
    ahead while the batch before ran (``runner/readahead.py``), else from ``path``. A
    handler that opens ``path`` itself finds the file read ahead in the page cache."""

    id: str
    path: str
    size: int
    data: Optional[bytes] = field(default=None, repr=False, compare=False)

    def read(self) -> bytes:
        """The input file's bytes."""
        if self.data is not None:
            return self.data
        with open(self.path, "rb") as fh:
            return fh.read()


def item_id(name: str) -> str:
    """The id of a file name: the name without its final extension."""
    stem, _ext = os.path.splitext(name)
    return stem or name


def list_inputs(spec: RunSpec) -> List[Item]:
    """Items of ``spec.inputs.dir`` matching ``spec.inputs.pattern``, sorted by id.

    Only regular files directly in the directory count (no recursion), hidden files are
    ignored. Two files with the same id (``a.txt`` and ``a.json``) are an error naming both,
    because the balance is keyed by id and would otherwise count one of them twice.
    """
    frames = spec.inputs.frames
    if frames is not None:
        return list_frames(spec.inputs.dir, spec.inputs.pattern or "*", frames)
    return list_dir(spec.inputs.dir, spec.inputs.pattern or "*")


def list_frames(directory: str, pattern: str, frames: Any) -> List[Item]:
    """One item per frame of each matching file, sorted by id; InputsError for a frame
    selection that cannot be read (the message names ``inputs.frames``)."""
    numbers = _frame_numbers(frames)
    return _per_frame(list_dir(directory, pattern), numbers)


def frames_of(files: List[Item], frames: Any) -> List[Item]:
    """``list_frames`` of files already listed (``list_dir``): one item per frame."""
    return _per_frame(files, _frame_numbers(frames))


def _frame_numbers(frames: Any) -> List[int]:
    from runner.frames import FramesError, parse_frames

    try:
        return parse_frames(frames)
    except FramesError as exc:
        raise InputsError(f"inputs.frames: {exc}") from exc


def _per_frame(files: List[Item], numbers: List[int]) -> List[Item]:
    from runner.frames import frame_id

    items = [Item(id=frame_id(os.path.basename(it.path), n), path=it.path, size=it.size)
             for it in files for n in numbers]
    items.sort(key=lambda it: it.id)
    return items


def list_dir(directory: str, pattern: str = "*") -> List[Item]:
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise InputsError(f"inputs.dir {directory}: cannot list: {exc.strerror or exc}") from exc
    seen: Dict[str, str] = {}
    items: List[Item] = []
    for name in sorted(names):
        if name.startswith(".") or not fnmatch.fnmatchcase(name, pattern):
            continue
        path = os.path.join(directory, name)
        try:
            st = os.stat(path)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode):
            continue
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            shown = os.fsencode(name).decode("utf-8", errors="backslashreplace")
            raise InputsError(f"inputs.dir {directory}: file name {shown!r} is not valid "
                              f"UTF-8; rename it (ids are written to JSON and SQLite)") from None
        iid = item_id(name)
        if iid in seen:
            raise InputsError(
                f"inputs.dir {directory}: files {seen[iid]} and {name} have the same id {iid!r}"
            )
        seen[iid] = name
        items.append(Item(id=iid, path=os.path.abspath(path), size=st.st_size))
    items.sort(key=lambda it: it.id)
    return items

