"""A refused collection is a failure the thread shows (issue 35, point 3): the ``collect``
stage's failure, as the runner words it, reaches the first error and the stage lines,
naming the node and why."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bot.messages.views import stage_detail
from runner.volume_collect import DISK_RESERVE
from tests.bot.fakes import pilot_script
from tests.bot.test_service import IDS, make, submit

WHY = (f"node-2: 5,368,709,120 bytes of outputs to collect (412 file(s)), but the head's "
       f"run directory /srv/runs/r-1 has 2,147,483,648 bytes free for the 5,368,709,120 "
       f"bytes of every node (+ {DISK_RESERVE:,} kept free): nothing collected")
ERROR = {"type": "StageFailure",
         "message": f"the outputs of the other nodes were not all collected: {WHY}",
         "where": None, "hint": "what was collected is kept; `preflight resume RUN` "
                                "collects the rest once the node answers"}


def script(run_id: str) -> list[dict[str, Any]]:
    events = pilot_script(IDS, refuse=(), finish=False)
    at = next(n for n, e in enumerate(events) if e.get("stage") == "balance")
    events[at:at] = [{"type": "stage.started", "stage": "collect"},
                     {"type": "stage.failed", "stage": "collect", "error": ERROR,
                      "facts": {"problems": [WHY], "problems_total": 1}}]
    return [*events, {"type": "run.finished", "status": "failed", "stage_reached": "collect",
                      "first_error": {"stage": "collect", **ERROR}}]


def test_a_refused_collection_fails_the_run_and_the_thread_names_the_node_and_why(
        tmp_path: Path) -> None:
    service, notifier = make(tmp_path, script)
    run = service.follower.follow(submit(service, tmp_path), timeout=30)
    assert run["outcome"] == "failed"
    assert (run["first_error"]["stage"], run["first_error"]["message"]) == (
        "collect", ERROR["message"])
    shown = next(m for m in notifier.history if m.key == "first_error")
    text = str(shown.blocks)
    assert "collect" in text and "node-2" in text and "2,147,483,648 bytes free" in text
    assert "preflight resume RUN" in text
    row = next(s for s in service.store.stages(run["id"]) if s["stage"] == "collect")
    assert row["state"] == "failed" and WHY in stage_detail(row)
