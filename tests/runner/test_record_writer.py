"""The volume driver's recording thread (runner.recording.RecordWriter): in order, bounded,
its first error held for the caller, drained by close."""

from __future__ import annotations

import threading

from runner.recording import RecordWriter


def test_jobs_run_in_order_on_one_thread_and_close_drains_them() -> None:
    gate, stuck = threading.Event(), threading.Event()
    seen: list[tuple[int, str]] = []
    writer = RecordWriter(limit=4)
    writer.put(lambda: (stuck.set(), gate.wait(30)))  # the disk is stuck: the caller goes on
    assert stuck.wait(30)
    for n in range(3):
        writer.put(lambda n=n: seen.append((n, threading.current_thread().name)))
    assert seen == [] and writer.pending() == 3
    full = threading.Thread(target=lambda: [writer.put(lambda: None) for _ in range(3)])
    full.start()
    full.join(0.2)
    assert full.is_alive()  # bounded: a fourth job waits for room
    gate.set()
    full.join(30)
    assert writer.close() is None
    assert seen == [(0, "recording"), (1, "recording"), (2, "recording")]
    assert writer.done == 7 and writer.busy_s > 0


def test_the_first_error_is_held_and_later_jobs_are_dropped() -> None:
    writer = RecordWriter()
    ran: list[int] = []
    writer.put(lambda: ran.append(1))
    writer.put(lambda: (_ for _ in ()).throw(OSError("disk full")))
    writer.put(lambda: ran.append(3))
    error = writer.close()
    assert isinstance(error, OSError) and str(error) == "disk full"
    assert ran == [1] and writer.error is error
    assert writer.close() is error  # closed twice: the same answer
