"""What a fetch has brought back so far, and what it may still bring: the staging folder
kept between tries, and the caps counted as bytes arrive.

The staging folder (``.fetch-<run id>`` beside the evidence home, ``.fetch`` in the run
directory for a run without an evidence copy) is the bot's own: a cut try leaves it, and
the next try tells the node what it holds (``held``: each file's SHA-256), so what
verifies is not sent again. Only a complete try's copy, verified, replaces what the bot
host had (``bot/nodes/ssh/fetch.py``).
"""

from __future__ import annotations

import errno
import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from bot.dispatch.host_tree import HostDir
from bot.dispatch.upload import write_layout
from bot.errors import DispatchError
from bot.nodes.ssh.transfer import Meter
from bot.pilot.fetch_caps import FetchCaps
from runner.evidence import file_sha256

# The most a fetch brings back from one node: ``total_bytes`` and ``files`` in all,
# ``file_bytes`` for one file, sized per run (``for_inputs``). Files the bot already holds
# from a cut try count too: the caps bound the copy, not one try.
FetchLimits = FetchCaps

# The records of the run directory the bot reads once the run has ended that the evidence
# copy holds: linked (or copied) from the fetched copy on the bot host, never fetched twice.
RUN_RECORDS = ("balance.csv", "balance.json")
LAYOUT_FILE = "remote.json"  # the SSH dispatch's record of the run (bot/dispatch/upload.py)
log = logging.getLogger(__name__)


def held_files(staging: HostDir) -> Iterator[tuple[str, str, int]]:
    """(relative path, SHA-256, size) of each regular file in the staging folder, read
    without following a link (the folder is the bot's own, filled by ``HostDir``)."""
    for base, dirs, names in os.walk(staging.path):
        dirs.sort()
        for name in sorted(names):
            path = os.path.join(base, name)
            st = os.lstat(path)
            if os.path.isfile(path) and not os.path.islink(path):
                rel = os.path.relpath(path, staging.path).replace(os.sep, "/")
                yield rel, file_sha256(path), st.st_size


def prune(staging: HostDir, keep: set[str]) -> None:
    """Remove the files of the staging folder the node's stream did not name (gone from
    the node since the cut try): the copy holds what the node holds, nothing more."""
    for base, _dirs, names in os.walk(staging.path):
        for name in names:
            rel = os.path.relpath(os.path.join(base, name), staging.path).replace(os.sep, "/")
            if rel not in keep:
                staging.unlink(rel.split("/"))


class Budget:
    """The files and bytes a fetch has brought back (``held`` from a cut try included),
    against its limits; told to the transfer's ``meter`` too, if it has one."""

    def __init__(self, run_id: str, limits: FetchLimits, meter: Meter | None = None) -> None:
        self.run_id, self.limits, self.meter = run_id, limits, meter
        self.total = self.files = 0
        self.sent_files = self.sent_bytes = 0  # what this try's stream carried (held aside)

    def file(self, rel: str, size: int, *, held: bool = False) -> None:
        """A file the node announces, ``size`` bytes: refused before a byte is read when
        it passes a cap. ``held``: the bot already has it (counted, not sent)."""
        self.files += 1
        if self.files > self.limits.files:
            raise self._over(rel, f"it is file {self.files} of the fetch, over the cap of "
                                  f"{self.limits.files} files", "PREFLIGHT_FETCH_MAX_FILES")
        if size > self.limits.file_bytes:
            raise self._over(rel, f"{size} bytes, over the cap of {self.limits.file_bytes} "
                                  "bytes per file", "PREFLIGHT_FETCH_MAX_FILE_BYTES")
        if self.total + size > self.limits.total_bytes:
            if self.limits.sized:
                raise DispatchError(
                    f"run {self.run_id}: the results on the node are larger than its pilot "
                    f"foretold: {rel!r}: it would bring the fetch to {self.total + size} "
                    f"bytes, over this run's cap of {self.limits.total_bytes} bytes (sized "
                    "from its pilot's evidence copy); the fetch is stopped there and nothing "
                    "was replaced. Look at why, then `preflight fetch RUN` brings it back "
                    "under the bot host's PREFLIGHT_FETCH_MAX_BYTES")
            raise self._over(rel, f"it would bring the fetch to {self.total + size} bytes, "
                                  f"over the cap of {self.limits.total_bytes} bytes",
                             "PREFLIGHT_FETCH_MAX_BYTES")
        if held:
            self.total += size
            return
        self.sent_files += 1
        if self.meter is not None:
            self.meter.expect(size, files=1)  # the fetch's ceiling grows with both

    def add(self, rel: str, done: int, more: int, size: int) -> None:
        """``more`` bytes of ``rel`` arrived (``done`` before them): never more than its
        header announced (``size``), which the caps allowed."""
        if done + more > size:
            raise self._over(rel, f"more than the {size} bytes its header announced",
                             "PREFLIGHT_FETCH_MAX_BYTES")
        self.total += more
        self.sent_bytes += more
        if self.meter is not None:
            self.meter.moved(more)

    def _over(self, rel: str, why: str, setting: str) -> DispatchError:
        return DispatchError(
            f"run {self.run_id}: the results on the node are too large: {rel!r}: {why}; the "
            f"fetch is stopped there and nothing was replaced (raise {setting} on the bot "
            "host, or leave less in the evidence copy)")


def record_fetched(run_dir: Path, measured: tuple[float, int, int]) -> None:
    """What the complete try's stream carried, in the run's ``remote.json`` (``fetched``:
    ``{"seconds", "files", "bytes"}``): the forecast of a volume scales its fetch from it
    (``bot/service/forecast_inputs.py``). A try that sent nothing (all held) measured no
    rate: the record is left as it was. Best effort: the fetch itself has succeeded."""
    seconds, files, size = measured
    if files < 1:
        return
    path = run_dir / LAYOUT_FILE
    try:
        layout = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(layout, dict):
            write_layout(path, {**layout, "fetched": {
                "seconds": round(seconds, 3), "files": files, "bytes": size}})
    except (OSError, ValueError) as exc:
        log.warning("%s: the fetch's measure not recorded: %s", path, exc)


def link_records(run_id: str, home: Path, run_dir: Path) -> None:
    """The balance the thread uploads, in the run directory: a hard link to the verified
    copy's (a copy across file systems), never fetched a second time."""
    with HostDir(home) as src, HostDir(run_dir) as dst:
        for name in RUN_RECORDS:
            try:
                dst.remove(name)
                try:
                    os.link(name, name, src_dir_fd=src.fd, dst_dir_fd=dst.fd,
                            follow_symlinks=False)
                except OSError as exc:
                    if exc.errno != errno.EXDEV:
                        raise
                    _copy_at(src, dst, name)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("run %s: %s not placed in the run directory: %s",
                            run_id, name, exc)


def _copy_at(src: HostDir, dst: HostDir, name: str) -> None:
    fd_in = os.open(name, os.O_RDONLY | os.O_NOFOLLOW, dir_fd=src.fd)
    try:
        fd_out = dst.create((name,), replace=True)
        try:
            while chunk := os.read(fd_in, 1 << 20):
                _write_all(fd_out, chunk)
        finally:
            os.close(fd_out)
    finally:
        os.close(fd_in)


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
