"""Read ahead (issue 34, point 5): the worker's reader (runner/readahead.py) and the
queue's reservations that tell it what comes next (runner/volume_queue.py)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from runner.inputs import Item
from runner.readahead import ReadAhead
from runner.volume_queue import Batch, BatchQueue


def _files(root: Path, n: int, size: int = 10) -> list[list[Any]]:
    payload = []
    for k in range(n):
        (root / f"f{k}.bin").write_bytes(bytes([k]) * size)
        payload.append([f"f{k}", f"f{k}.bin", size])
    return payload


def test_the_next_batch_s_bytes_come_from_memory_and_the_rest_from_the_file(
        tmp_path: Path) -> None:
    payload = _files(tmp_path, 6)
    reader = ReadAhead()
    first = reader.items(payload[:3], str(tmp_path))
    assert all(it.data is None for it in first) and first[0].read() == bytes([0]) * 10
    reader.start([payload[3:]], str(tmp_path))
    reader.join(10)
    (tmp_path / "f3.bin").write_bytes(b"changed")  # the read was made before: it is used
    nxt = reader.items(payload[3:], str(tmp_path))
    assert [it.read() for it in nxt] == [bytes([k]) * 10 for k in (3, 4, 5)]
    assert nxt[0].path == os.path.join(str(tmp_path), "f3.bin") and nxt[0] == Item(
        "f3", os.path.join(str(tmp_path), "f3.bin"), 10)  # data is no part of equality
    assert reader.stats["hits"] == 3 and reader.stats["misses"] == 3


def test_memory_is_capped_and_a_batch_given_to_another_worker_is_dropped(
        tmp_path: Path) -> None:
    payload = _files(tmp_path, 4, size=100)
    reader = ReadAhead(cap=250)
    reader.start([payload], str(tmp_path))
    reader.join(10)
    assert reader.stats["read_bytes"] == 200 and reader.stats["hinted"] == 4
    # the worker got another batch: what was read is dropped, nothing held any more
    other = reader.items(payload[3:], str(tmp_path))
    assert other[0].data is None and reader._held == {} and reader._bytes == 0


def test_a_file_that_cannot_be_read_ahead_is_left_to_the_handler(tmp_path: Path) -> None:
    reader = ReadAhead()
    reader.start([[["gone", "gone.bin", 3]]], str(tmp_path))
    reader.join(10)
    item = reader.items([["gone", "gone.bin", 3]], str(tmp_path))[0]
    assert item.data is None  # the handler meets the error itself, as without read ahead


def _items(n: int) -> list[Item]:
    return [Item(f"i{k}", f"/x/i{k}", 1) for k in range(n)]


def test_a_worker_runs_the_batches_reserved_for_it_in_order() -> None:
    queue = BatchQueue([Batch(n, _items(1)) for n in range(5)])
    first = queue.take(0)
    assert first is not None and first.n == 0
    assert [b.n for b in queue.reserve(0, 1)] == [1]
    other = queue.take(1)
    assert other is not None and other.n == 2  # not worker 0's reserved batch
    nxt = queue.take(0)
    assert nxt is not None and nxt.n == 1 and len(queue) == 2


def test_an_idle_worker_takes_a_reserved_batch_and_a_lost_one_s_go_back() -> None:
    queue = BatchQueue([Batch(n, _items(1)) for n in range(3)])
    queue.take(0)
    queue.reserve(0, 2)
    assert not queue.queue and len(queue) == 2 and queue
    assert queue.take(1) is None  # a busy worker waits for the queue
    stolen = queue.take(1, steal=True)
    assert stolen is not None and stolen.n == 2  # the one worker 0 would run last
    queue.release(0)
    assert [b.n for b in queue.queue] == [1] and not queue.reserved
