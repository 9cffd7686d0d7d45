"""The volume's pace and engine notes, as the thread and the terminal show them."""

from __future__ import annotations

from bot.console.render import to_text
from bot.messages.volume_view import progress_of, volume_message
from bot.slack.blocks import progress_text
from runner.events import Event
from tests.bot.runs import run_of

RUN = run_of(id="r-v1", name="corpus")


def _ev(seq: int, etype: str, **data: object) -> Event:
    return Event(seq=seq, type=etype, run="r-v1", ts="2026-12-03T12:00:00Z", data=dict(data))


def test_progress_shows_rate_eta_and_per_worker_rates_when_measured() -> None:
    block = progress_of({"done": 500, "total": 2000, "items_per_s": 125.0, "eta_s": 720,
                         "per_card": {"w0@a[0]": 62.5, "w1@b[0]": 62.5}})
    assert block.pace == "125.0 items/s · ETA 12 min · 2 worker(s): w0@a[0] 62.5, w1@b[0] 62.5"
    assert "500/2000 (25%)" in progress_text(block) and "ETA 12 min" in progress_text(block)
    assert progress_of({"done": 3, "total": 12}).pace == ""  # the pilot's plain progress


def test_an_eta_admits_a_batch_held_far_longer_than_a_batch_takes() -> None:
    """One hung input: the pace says ETA 1 s for minutes; the ETA now says a batch is held,
    for how long, and when its worker would be stopped (issue 37, point 5)."""
    block = progress_of({"done": 4990, "total": 5000, "items_per_s": 118.0, "eta_s": 0.8,
                         "held": 1, "held_s": 45.2, "held_limit_s": 60.0})
    assert block.pace == "118.0 items/s · ETA 1 s (1 batch held for 45 s, its worker " \
                         "stopped at 60 s)"
    two = progress_of({"done": 1, "total": 9, "items_per_s": 1.0, "eta_s": 8, "held": 2,
                       "held_s": 200})
    assert two.pace == "1.0 items/s · ETA 8 s (2 batches held for 3 min)"


def test_engine_notes_name_what_was_lost_requeued_excluded_and_counted_once() -> None:
    events = [
        _ev(9, "volume.late_result", batch=4, worker="w2@c[0]", recorded=0, re_executed=25),
        _ev(3, "volume.workers", workers=[{"node": "n1"}, {"node": "n1"}, {"node": "n2"}]),
        _ev(5, "volume.node_lost", node="n2abcdef0123456789", workers=["w2@c[0]"], cards=["0"]),
        _ev(4, "volume.worker_lost", worker="w2@c[0]", reason="ActorDiedError: node died"),
        _ev(6, "volume.requeued", batch=7, items=25, reason="worker w2@c[0] was lost"),
        _ev(8, "volume.card_excluded", worker="w1@b[0]", reason="batch 4 out for more than 60 s"),
        _ev(7, "progress", done=1, total=2),
    ]
    message = volume_message(RUN, events)
    assert message is not None and message.key == "volume"
    text = to_text(message)
    lines = [ln for ln in text.splitlines() if ln.strip()]
    assert lines[1] == "3 worker(s) started on 2 node(s)"  # in event order
    assert "node n2abcdef0123 lost with 1 worker(s) and card(s) 0" in text
    assert "batch 7 (25 items) re-queued: worker w2@c[0] was lost" in text
    assert "w1@b[0] excluded: batch 4 out for more than 60 s" in text
    assert "25 already recorded (counted as re-executed, never twice)" in text
    assert volume_message(RUN, [_ev(1, "progress", done=0, total=1)]) is None


def test_engine_notes_say_which_node_was_lost_and_why_and_which_input_was_refused() -> None:
    events = [
        _ev(1, "volume.node_lost", node="n2abcdef0123456789", host="gpu-b", workers=["w2@gpu-b[0]"],
            cards=["0"], reason="the node left the Ray cluster (not alive in ray.nodes())"),
        _ev(2, "volume.split", batch=4, items=25, cause="late", reason="held past 90 s",
            parts=[40, 41], refused=[]),
        _ev(3, "volume.split", batch=45, items=1, cause="late", reason="held past 90 s",
            parts=[], refused=[{"id": "doc-417", "reason": "timeout: its worker held it past "
                                                          "the volume's batch timeout of 90 s"}]),
        _ev(4, "volume.worker_started", worker="w9@gpu-a[3]", cards=["3"],
            why="in place of w3@gpu-a[3] (held batch 4 past 90 s)"),
    ]
    text = to_text(volume_message(RUN, events))  # type: ignore[arg-type]
    assert ("node n2abcdef0123 (gpu-b) lost with 1 worker(s) and card(s) 0: the node left the "
            "Ray cluster (not alive in ray.nodes()); its batches go to the other nodes") in text
    assert "batch 4 (25 items) split in 2 (late: held past 90 s)" in text
    assert "input doc-417 refused: timeout: its worker held it past the volume's batch " \
           "timeout of 90 s" in text
    assert "worker w9@gpu-a[3] started in place of w3@gpu-a[3] (held batch 4 past 90 s)" in text
