"""Bringing a finished SSH run's results back: retried after a drop, never half-verified.

The remote run directory is copied into ``<run dir>/.fetch/`` and the evidence copy into
``<copy_to>/.fetch-<run id>/``; only a complete copy is moved into place, so a drop in the
middle leaves what was there before, never a half copy under the final name. A drop is
retried (the dispatcher's ``attempts``, with its backoff); the evidence is verified only
once its copy is complete (``verify_fetched``).
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Protocol, TypeVar

from bot.dispatch.base import RunHandle
from bot.dispatch.upload import Backoff, SSHNode, verify_fetched
from bot.errors import DispatchError, NodeUnreachable

T = TypeVar("T")


class SSHDispatcher(Protocol):
    """What a fetch needs of ``bot.dispatch.ssh.SSHDispatcher`` (no import back to it)."""

    attempts: int
    backoff: Backoff

    async def guarded(self, node: SSHNode,
                      work: Callable[[Any], Coroutine[Any, Any, T]]) -> T: ...

    async def sftp_of(self, conn: Any) -> Any: ...

LOCAL_ERRORS = (PermissionError, FileNotFoundError, NotADirectoryError, IsADirectoryError)


async def fetch_results(dispatcher: SSHDispatcher, handle: RunHandle, node: SSHNode,
                        layout: dict[str, Any]) -> Path | None:
    """Copy the run directory (and the evidence copy) back; raise ``NodeUnreachable`` when
    every try was cut off, ``DispatchError`` when the node answered but the copy failed.
    Returns the verified evidence copy on the bot host, when there is one."""
    evidence = layout.get("evidence") or {}
    for attempt in range(dispatcher.attempts):
        try:
            await dispatcher.guarded(node, lambda conn: _copy(dispatcher, conn, handle, layout))
            break
        except NodeUnreachable as exc:
            if attempt + 1 == dispatcher.attempts:
                raise NodeUnreachable(f"cannot fetch the results of {handle.run_id} after "
                                      f"{dispatcher.attempts} tries: {exc}") from exc
            await asyncio.sleep(dispatcher.backoff.delay(attempt))
        finally:
            _remove(handle.run_dir / ".fetch")
            if evidence.get("local"):
                _remove(Path(evidence["local"]) / f".fetch-{handle.run_id}")
    if evidence.get("local"):
        copy = Path(evidence["local"]) / handle.run_id
        verify_fetched(handle, copy)
        return copy
    return None


async def _copy(dispatcher: SSHDispatcher, conn: Any, handle: RunHandle,
                layout: dict[str, Any]) -> None:
    sftp = await dispatcher.sftp_of(conn)
    run_dir = layout["run_dir"]
    evidence = layout.get("evidence") or {}
    try:
        staging = _fresh(handle.run_dir / ".fetch")
        names = [n for n in await sftp.listdir(run_dir) if n not in (".", "..", "spec.json")]
        for name in names:
            await sftp.get(f"{run_dir}/{name}", str(staging), recurse=True)
        src = f"{evidence.get('remote')}/{handle.run_id}"
        copied = None
        if evidence.get("local") and await sftp.exists(src):
            dest = Path(evidence["local"])
            copied = _fresh(dest / f".fetch-{handle.run_id}")
            await sftp.get(src, str(copied), recurse=True)
        # Complete: only now does anything replace what the bot host had.
        for name in names:
            _replace(staging / name, handle.run_dir / name)
        if copied is not None:
            _replace(copied / handle.run_id, Path(evidence["local"]) / handle.run_id)
    except LOCAL_ERRORS as exc:
        raise DispatchError(f"cannot write the results of {handle.run_id} on the bot "
                            f"host: {exc}") from exc
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EROFS, errno.EDQUOT):
            raise DispatchError(f"cannot write the results of {handle.run_id} on the bot "
                                f"host: {exc}") from exc
        raise


def _fresh(path: Path) -> Path:
    _remove(path)
    path.mkdir(parents=True)
    return path


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    elif path.exists():
        path.unlink()


def _replace(src: Path, dst: Path) -> None:
    if dst.is_dir() and not dst.is_symlink():
        shutil.rmtree(dst)
    os.replace(src, dst)
