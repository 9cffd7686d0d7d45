"""The run's inputs, checked at submission and checked again at dispatch.

A run may wait hours for its lease between the policy's check (submission) and its
dispatch; meanwhile its ``inputs.dir`` (or a file in it) can be swapped for a link to
``~/.ssh``. So the submission records what was checked (``inputs.checked.json`` in the
run directory: the folder resolved, and each input file's name and resolved path), and the
dispatch lists the folder again and refuses the run, naming ``inputs.dir`` and the file,
when the folder no longer resolves to itself or any input was added, removed or now leads
elsewhere. What is sent to a node is that checked list: the resolved paths, each opened
without following a link (``O_NOFOLLOW``), so a swap after the check fails the send
instead of reading the link's target. A refusal never says where a link leads.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.dispatch.base import first_difference
from bot.errors import DispatchError
from runner.files import write_text_atomic
from runner.inputs import InputsError, list_dir

INPUTS_FILE = "inputs.checked.json"


@dataclass(frozen=True)
class CheckedInputs:
    """The inputs folder (resolved) and each input file: name -> resolved path."""

    dir: Path
    files: dict[str, Path]


def record_inputs(run_dir: Path, directory: str, pattern: str | None) -> None:
    """At submission, after the policy's checks: what the dispatch will hold the inputs to
    (a folder that cannot be listed yet is recorded as such; the dispatch then allows no
    input leading out of it)."""
    try:
        listed: list[str] | None = [path for _, path in _listed(os.path.realpath(directory),
                                                                pattern)]
    except InputsError:
        listed = None
    record_listing(run_dir, directory, listed)


def record_listing(run_dir: Path, directory: str, listed: Sequence[str] | None) -> None:
    """``record_inputs`` of the files the policy checked (their paths, as listed in
    ``directory`` when the manifest was loaded; None: it could not be listed), so the
    submission lists its inputs folder once."""
    real = os.path.realpath(directory)
    files = None if listed is None else {os.path.basename(path): os.path.realpath(path)
                                         for path in listed}
    write_text_atomic(run_dir / INPUTS_FILE, json.dumps({"dir": real, "files": files},
                                                        indent=1, sort_keys=True))


def recheck_inputs(run_dir: Path, spec: dict[str, Any]) -> CheckedInputs:
    """The inputs as checked at submission, after making sure they still are: a
    DispatchError naming ``inputs.dir`` (and the file) when anything changed."""
    inputs = spec.get("inputs") or {}
    directory, pattern = str(inputs.get("dir") or ""), inputs.get("pattern")
    record = _load(run_dir)
    checked = str(record.get("dir") or directory)
    refuse = f"inputs.dir {directory}"
    again = ("; the run is not dispatched: check the folder and submit the manifest again")
    before = record.get("files")
    try:
        mode = os.lstat(checked).st_mode
    except FileNotFoundError:
        if not isinstance(before, dict) and os.path.realpath(directory) == checked:
            return CheckedInputs(Path(checked), {})  # never there: the runner says so
        raise DispatchError(f"{refuse}: gone since the check at submission{again}") from None
    except OSError as exc:
        raise DispatchError(f"{refuse}: cannot be read at dispatch ({exc.strerror}){again}"
                            ) from exc
    if (os.path.realpath(directory) != checked or os.path.realpath(checked) != checked
            or not stat.S_ISDIR(mode)):
        raise DispatchError(f"{refuse} no longer resolves to the folder checked at "
                            f"submission (swapped for a link?){again}")
    try:
        now = {name: os.path.realpath(path) for name, path in _listed(checked, pattern)}
    except InputsError as exc:
        if not isinstance(before, dict):  # not listable at submission either: the runner
            return CheckedInputs(Path(checked), {})  # reports it, and nothing is read
        raise DispatchError(f"{exc}{again}") from exc
    first = first_difference(before, now) if isinstance(before, dict) else None
    if first is not None:
        name, how = first
        change = {"extra": "was added after the check at submission",
                  "missing": "is gone since the check at submission",
                  "differs": "now leads elsewhere than when it was checked at submission"}
        raise DispatchError(f"{refuse}: {name!r} {change[how]}{again}")
    if not isinstance(before, dict):  # nothing listed at submission: none may lead out
        for name, target in now.items():
            if not Path(target).is_relative_to(checked):
                raise DispatchError(f"{refuse}: {name!r} is a link leading out of the "
                                    f"folder{again}")
    return CheckedInputs(Path(checked), {name: Path(target) for name, target in now.items()})


def checked_files(inputs: CheckedInputs) -> dict[str, tuple[Path, str]]:
    """The checked files to send (name -> (resolved path, sha256)), each read without
    following a link: one swapped since the check is a DispatchError."""
    out: dict[str, tuple[Path, str]] = {}
    for name, path in sorted(inputs.files.items()):
        digest = hashlib.sha256()
        with open_checked(path) as fh:
            for chunk in iter(lambda: fh.read(1 << 20), b""):
                digest.update(chunk)
        out[name] = (path, digest.hexdigest())
    return out


def open_checked(path: Path) -> Any:
    """A checked input (a resolved path) opened for reading, never through a link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise DispatchError(f"{path}: cannot read the input checked at submission "
                            f"({exc.strerror}: swapped for a link?); submit again") from exc
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise DispatchError(f"{path}: the input checked at submission is no longer a "
                            "regular file; submit again")
    return os.fdopen(fd, "rb")


def _listed(directory: str, pattern: str | None) -> list[tuple[str, str]]:
    return [(os.path.basename(item.path), item.path)
            for item in list_dir(directory, pattern or "*")]


def _load(run_dir: Path) -> dict[str, Any]:
    """The submission's record; {} for a run submitted before records were kept."""
    try:
        data = json.loads((run_dir / INPUTS_FILE).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        raise DispatchError(f"{run_dir / INPUTS_FILE}: cannot read the inputs checked at "
                            f"submission: {exc}") from exc
    return data if isinstance(data, dict) else {}
