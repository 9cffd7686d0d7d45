"""A volume worker reads its next batch's input files while the handler computes this one.

With ``volume.prefetch`` on (the default), the driver hands each worker, with every batch,
the batches it will run next on that worker (``runner.volume_queue.BatchQueue.reserve``).
The worker starts a background thread on them as soon as the batch begins, so the files
are read while the handler computes, and the handler's next batch:

- gets each input's bytes from memory through ``item.read()`` (``runner.inputs.Item``),
  without a system call;
- finds the files it opens itself (``open(item.path)``) already in the page cache.

Memory is bounded: at most ``cap`` bytes are held (``CAP_BYTES`` by default); a file
beyond it is only announced to the kernel (``posix_fadvise(WILLNEED)``: read into the
page cache, asynchronously, nothing held here). Bytes read for a batch the worker does not
get next (the driver gave it to another worker) are dropped when the next batch starts.
A read that fails is left to the handler, which meets the error itself. The reader never
holds the handler back: what is not read when a batch starts is read by the handler as
without read ahead. Standard library only.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Sequence

from runner.inputs import Item

CAP_BYTES = 256 * 1024 * 1024  # bytes held in memory ahead, per worker
CHUNK = 1 << 20


class ReadAhead:
    """Reads paths in a background thread, holding their bytes up to a cap."""

    def __init__(self, cap: int = CAP_BYTES) -> None:
        self.cap = max(0, int(cap))
        self._lock = threading.Lock()
        self._held: Dict[str, bytes] = {}
        self._bytes = 0
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.stats = {"hits": 0, "misses": 0, "read_bytes": 0, "hinted": 0}

    def items(self, batch: Sequence[Sequence[Any]], root: str) -> List[Item]:
        """The batch's items (``[id, relative path, size]`` each), with the bytes read
        ahead for them; everything else held is dropped."""
        self._stop.set()  # the reader of the batch before stops after its current file
        with self._lock:
            held, self._held, self._bytes = self._held, {}, 0
        items = []
        for iid, rel, size in batch:
            path = os.path.join(root, str(rel))
            data = held.pop(path, None)
            self.stats["hits" if data is not None else "misses"] += 1
            items.append(Item(str(iid), path, int(size), data=data))
        return items

    def start(self, ahead: Optional[Sequence[Sequence[Sequence[Any]]]], root: str) -> None:
        """Read the files of the batches ``ahead`` (payloads, in the order they will run)
        in a background thread."""
        paths = [os.path.join(root, str(rel)) for batch in ahead or () for _i, rel, _s in batch]
        if not paths:
            return
        self._stop = threading.Event()
        thread = threading.Thread(target=self._read, args=(paths, self._stop),
                                  name="preflight-readahead", daemon=True)
        self._thread = thread
        thread.start()

    def join(self, timeout: Optional[float] = None) -> None:
        """Wait for the reader (tests, and a bench that wants it finished)."""
        if self._thread is not None:
            self._thread.join(timeout)

    def _read(self, paths: List[str], stop: threading.Event) -> None:
        for path in paths:  # first the kernel reads them all, at once, into its cache
            if stop.is_set():
                return
            try:
                _hint(path)
            except OSError:
                pass
        self.stats["hinted"] += len(paths)
        for path in paths:  # then their bytes are held here, up to the cap
            if stop.is_set():
                return
            try:
                size = os.stat(path).st_size
                with self._lock:
                    room = path not in self._held and self._bytes + size <= self.cap
                if not room:
                    continue
                data = _read_file(path, stop)
            except OSError:
                continue  # the handler meets the error itself
            if data is None:
                return
            with self._lock:
                if stop.is_set():
                    return
                self._held[path] = data
                self._bytes += len(data)
                self.stats["read_bytes"] += len(data)


def _read_file(path: str, stop: threading.Event) -> Optional[bytes]:
    """The file's bytes, read in chunks so a stop is seen within one; None when stopped."""
    parts: List[bytes] = []
    with open(path, "rb") as fh:
        while True:
            if stop.is_set():
                return None
            chunk = fh.read(CHUNK)
            if not chunk:
                return b"".join(parts)
            parts.append(chunk)


def _hint(path: str) -> None:
    """Ask the kernel to read the file into the page cache (nothing held here)."""
    advise = getattr(os, "posix_fadvise", None)
    if advise is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        advise(fd, 0, 0, os.POSIX_FADV_WILLNEED)
    finally:
        os.close(fd)
