"""Atomic file writes: the one helper of the runner and the bot (part of the contract).

A file is written under a temporary name in its own directory, ``.<name>.tmp-<pid>``
(opened with ``O_NOFOLLOW``: never through a link), flushed and fsynced, then renamed over
the final name (a link under that name is replaced, not followed). A crash at any instant
leaves the previous file or the complete new one, never a truncated file under the final
name; a leftover temporary file is recognised by ``is_temp_name`` (hidden, ``.tmp-`` inside).
Standard library only.
"""

from __future__ import annotations

import json
import os
from contextlib import contextmanager
from typing import IO, Any, Iterator

TEMP_MARK = ".tmp-"


def temp_path(path: str | os.PathLike[str]) -> str:
    """The temporary name ``path`` is written under before the rename."""
    head, name = os.path.split(os.fspath(path))
    return os.path.join(head, f".{name}{TEMP_MARK}{os.getpid()}")


def is_temp_name(name: str) -> bool:
    """True for a temporary file name this module creates (a leftover of a killed writer)."""
    return name.startswith(".") and TEMP_MARK in name


@contextmanager
def atomic_open(path: str | os.PathLike[str], binary: bool = False) -> Iterator[IO[Any]]:
    """Open ``path`` for writing; the file appears under its name only if the block ends
    without an exception (an exception removes the temporary file)."""
    final = os.fspath(path)
    tmp = temp_path(final)
    # O_NOFOLLOW: a link planted under the temporary name is an error, never written through
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    fh: IO[Any] = (os.fdopen(fd, "wb") if binary
                   else os.fdopen(fd, "w", encoding="utf-8", newline=""))
    try:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())
    except BaseException:
        fh.close()
        try:
            os.remove(tmp)
        except OSError:
            pass
        raise
    fh.close()
    os.replace(tmp, final)


def write_bytes_atomic(path: str | os.PathLike[str], data: bytes) -> None:
    with atomic_open(path, binary=True) as fh:
        fh.write(data)


def write_text_atomic(path: str | os.PathLike[str], text: str) -> None:
    with atomic_open(path) as fh:
        fh.write(text)


def write_json_atomic(path: str | os.PathLike[str], doc: Any) -> None:
    """Indented, sorted keys, UTF-8 as is, a final newline; unknown types as ``str``."""
    write_text_atomic(path, json.dumps(doc, indent=2, sort_keys=True, ensure_ascii=False,
                                       default=str) + "\n")


__all__ = ["TEMP_MARK", "temp_path", "is_temp_name", "atomic_open", "write_bytes_atomic",
           "write_text_atomic", "write_json_atomic"]
