"""The terminal display: drawn on a timer (never per event), every stage with its elapsed
time, the pilot's done/total, items per second and ETA, also off a terminal."""

from __future__ import annotations

import io
import time
from collections.abc import Callable

from rich.console import Console

from bot.console.notifier import ConsoleNotifier
from bot.console.render import to_text
from bot.messages.model import Message
from bot.messages.progress import ProgressMeter, duration, progress_words
from bot.messages.views import status_message
from tests.bot.runs import run_of

T0 = "2026-01-01T10:00:00.000000+00:00"


def stage(name: str, state: str, started: str = T0, ended: str | None = None) -> dict[str, object]:
    return {"stage": name, "state": state, "started_at": started, "ended_at": ended,
            "facts": {}, "error": None, "reason": None}


def pilot_status(done: int, per_s: float | None = 100.0) -> Message:
    run = run_of(id="r1", name="demo", kind="pilot", status="running")
    now = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(now - 30))
    stages = [stage("prepare", "passed", T0, "2026-01-01T10:00:01.500000+00:00"),
              stage("torch", "passed", T0, "2026-01-01T10:00:16.000000+00:00"),
              stage("pilot", "running", started)]
    meter = ProgressMeter()
    meter.update(0, 20000, 0.0)
    if per_s:
        meter.update(done, 20000, done / per_s)
    return status_message(run, stages, meter.block())


def wait_until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)  # polling a condition with a deadline


def test_meter_gives_rate_and_eta_and_words_say_them() -> None:
    meter = ProgressMeter()
    meter.update(0, 1000, 10.0)
    assert meter.block().per_s is None  # no rate from one sample
    meter.update(250, 1000, 12.5)  # 250 items in 2.5 s
    block = meter.block()
    assert (block.per_s, block.eta_s) == (100.0, 7.5)
    assert progress_words(block) == "250/1000 (25%), 100 items/s, ETA 7.5 s"
    assert duration(185) == "3 min 05 s" and duration(7300) == "2 h 01 min"


def test_every_stage_shows_its_elapsed_time_in_plain_text() -> None:
    text = to_text(pilot_status(5000), now=time.time())
    rows = {line.split()[1]: " ".join(line.split()[2:]) for line in text.splitlines()
            if line[:1] in "✓…"}
    assert rows["prepare"] == "passed 1.5 s" and rows["torch"] == "passed 16 s"
    pilot = next(line for line in text.splitlines() if line.startswith("… pilot"))
    assert "running" in pilot and ("30 s" in pilot or "31 s" in pilot)  # its time so far
    assert "5000/20000 (25%), 100 items/s, ETA 2 min 30 s" in text


def test_off_a_terminal_plain_lines_come_at_a_steady_rate_without_new_events() -> None:
    out = io.StringIO()
    notifier = ConsoleNotifier(Console(file=out, width=120), tick_s=0.01, plain_every_s=0.05)
    notifier.publish(pilot_status(5000))  # one state, then silence from the runner
    wait_until(lambda: out.getvalue().count("pilot running") >= 3)
    notifier.close_live()
    lines = out.getvalue().splitlines()
    assert any("✓ torch passed (16 s)" in line for line in lines)
    running = [line for line in lines if "pilot running" in line]
    assert all("5000/20000 (25%), 100 items/s, ETA 2 min 30 s" in line for line in running)


def test_states_are_drawn_on_a_timer_not_once_per_event() -> None:
    out = io.StringIO()
    notifier = ConsoleNotifier(Console(file=out, width=120), tick_s=0.05, plain_every_s=0.5)
    start = time.monotonic()
    for done in range(1, 5001):  # 5,000 progress states published as fast as possible
        notifier.publish(pilot_status(done))
    publishing_s = time.monotonic() - start
    notifier.close_live()
    printed = out.getvalue().splitlines()
    # one plain line per plain_every_s while they came (a loaded machine takes longer to
    # publish them, so more of those periods pass), one at the close: never one per event
    drawn = len([line for line in printed if "pilot running" in line])
    assert drawn <= 2 + int(publishing_s / 0.5) and drawn < 50, (drawn, publishing_s)
    assert "5000/20000 (25%)" in out.getvalue()  # the last state is the one shown at the end


def test_off_a_terminal_plain_lines_then_the_final_panels_once() -> None:
    """A log got every redrawn panel beside the plain lines (1,009 lines for one run): now
    each message gives a plain line when its summary changes, and the panels come once, at
    the end, each as it ended, in thread order (issue 37)."""
    from bot.messages.model import Heading, Text

    out = io.StringIO()
    notifier = ConsoleNotifier(Console(file=out, width=120), tick_s=0.01, plain_every_s=60)
    notifier.publish(Message("r1", "plan", (Heading("Plan for demo"),), summary="demo: planned"))
    notifier.publish(pilot_status(5000))
    for n in range(1, 51):  # the engine message, updated in place 50 times
        note = f"note {n // 10}"
        notifier.publish(Message("r1", "volume", (Heading("Volume engine — demo"), Text(note)),
                                 summary=note))
    notifier.publish(Message("r1", "verdict", (Heading("Verdict: PASSED"),),
                             summary="demo: pilot passed"))
    notifier.close_live()
    text = out.getvalue()
    assert text.count("Volume engine — demo") == 1 and text.count("Plan for demo") == 1
    assert [ln for ln in text.splitlines() if ln.startswith("note ")] == [
        f"note {k}" for k in range(6)]  # a plain line each time the summary changed
    panels = text.index("Plan for demo")
    assert panels > text.index("note 5") and panels > text.index("demo: pilot passed")
    assert panels < text.index("Diagnostics") < text.index("Volume engine") \
        < text.index("Verdict: PASSED")  # thread order, the status as it ended among them
    assert "│ note 5" in text  # each as it ended


def test_off_a_terminal_two_runs_keep_their_own_panels() -> None:
    """`preflight decide … approve` publishes the pilot's decision, then follows the volume:
    each run's panels come out, the volume's decision message never standing for the
    pilot's (they share a key)."""
    from bot.messages.model import Heading

    out = io.StringIO()
    notifier = ConsoleNotifier(Console(file=out, width=120), tick_s=0.01, plain_every_s=60)
    notifier.publish(Message("pilot", "decision", (Heading("Decision: approved"),),
                             summary="demo: Scale-up approved by alice"))
    notifier.publish(pilot_status(10))
    notifier.publish(Message("r1", "decision", (Heading("Volume run"),), summary="demo: x"))
    notifier.close_live()
    text = out.getvalue()
    assert text.index("Decision: approved") < text.index("Diagnostics") < \
        text.index("Volume run")
