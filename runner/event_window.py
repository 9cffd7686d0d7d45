"""Reading an events file by windows (the bot over SSH): whole lines, a long one skipped.

Part of the event contract (``runner.events`` re-exports every name here), so it stays
standard-library only.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Tuple

# A reader of events.jsonl by windows (the bot over SSH) reads READ_WINDOW bytes; a line
# longer than that grows the window, up to READ_WINDOW_MAX; a line longer still is skipped
# (``read_complete``), never waited on.
READ_WINDOW = 4 << 20
READ_WINDOW_MAX = 64 << 20


def read_complete(read: Callable[[int, int], bytes], offset: int, *,
                  window: int = READ_WINDOW, most: int = READ_WINDOW_MAX,
                  keep: Optional[Callable[[int, bytes], None]] = None,
                  ) -> Tuple[bytes, int, List[Tuple[int, int]]]:
    """Complete lines of an events file from ``offset``, read through ``read(at, size)``
    (at most ``size`` bytes from byte ``at``; fewer only at the end of the file).

    Reads ``window`` bytes; when they hold no whole line, the window doubles, up to
    ``most``: a long line is read, not waited on. A line longer than ``most`` is skipped:
    read on in pieces of ``most`` bytes (each handed to ``keep(at, piece)``, so a mirror of
    the file stays whole) to its newline. Returns ``(chunk, start, skipped)``: the bytes
    read from byte ``start`` (``offset`` unless lines were skipped; give both to
    ``parse_chunk``) and ``(offset, length)`` of each line skipped. A line not yet ended (a
    writer mid-append) is left for the next call.
    """
    skipped: List[Tuple[int, int]] = []
    size = window
    while True:
        chunk = read(offset, size)
        if b"\n" in chunk or len(chunk) < size:
            return chunk, offset, skipped
        if size < most:
            size = min(size * 2, most)
            continue
        if keep is not None:  # a line of any length: no more than ``most`` held at once
            keep(offset, chunk)
        pos = offset + len(chunk)
        while True:
            piece = read(pos, most)
            cut = piece.find(b"\n")
            if cut >= 0:
                if keep is not None:
                    keep(pos, piece[: cut + 1])
                end = pos + cut + 1
                break
            if len(piece) < most:
                return b"", offset, skipped  # the long line is not complete yet
            if keep is not None:
                keep(pos, piece)
            pos += len(piece)
        skipped.append((offset, end - offset))
        offset, size = end, window
