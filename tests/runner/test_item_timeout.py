"""task.item_timeout_s: a hanging item is refused naming the timeout, the rest goes on;
a pilot-level timeout names the batch in flight."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runner.itemtimeout import DEFAULT_ITEM_TIMEOUT_S, ItemClock
from tests.runner.test_stages_kit import events_of, outcomes, run_runner, runner_env, write_spec

HANGS = '''
import os, time

def handle(items, ctx):
    pilot = os.path.basename(ctx.outputs_dir) == "outputs"  # not the memory stage's dry run
    out = []
    for item in items:
        if item.id == "a2" and pilot:
            try:
                time.sleep(120)  # hangs (and a broad except cannot swallow the timeout)
            except Exception:
                pass
        out.append({"id": item.id, "status": "accepted", "category": "short"})
    return out
'''


def hanging_spec(tmp_path: Path, **task: object) -> Path:
    spec = write_spec(tmp_path, task={"handler": "hangs:handle", "batch_size": 2, **task})
    (tmp_path / "project" / "hangs.py").write_text(HANGS)
    return spec


def test_a_hanging_item_is_refused_and_the_rest_of_its_batch_goes_on(tmp_path: Path) -> None:
    spec = hanging_spec(tmp_path, item_timeout_s=0.5)
    run_dir = tmp_path / "run"
    done = run_runner(spec, run_dir, env=runner_env(tmp_path / "project"), timeout=120)
    events = events_of(run_dir)
    items = {e.data["id"]: e.data for e in events if e.type == "item.done"}
    assert sorted(items) == ["a1", "a2", "a3"]  # each exactly once
    assert items["a1"]["status"] == items["a3"]["status"] == "accepted"  # a2's batch-mate too
    assert items["a2"]["status"] == "refused"
    assert "task.item_timeout_s = 0.5 s" in items["a2"]["reason"]
    balance = json.loads((run_dir / "balance.json").read_text())
    assert (balance["accepted"], balance["refused"], balance["total"], balance["ok"]) == \
        (2, 1, 3, True)
    pilot = outcomes(events)["pilot"].data["facts"]
    assert pilot["timed_out"] == ["a2"] and "item_timeout" not in pilot  # the clock was on
    assert done.returncode == 0, done.stderr


def test_a_pilot_timeout_names_the_batch_in_flight(tmp_path: Path) -> None:
    spec = hanging_spec(tmp_path, item_timeout_s=0, batch_size=1)
    spec_doc = json.loads(spec.read_text())
    spec_doc["diagnostics"]["timeouts"] = {"pilot": 3}
    spec.write_text(json.dumps(spec_doc))
    run_dir = tmp_path / "run"
    run_runner(spec, run_dir, env=runner_env(tmp_path / "project"), timeout=120)
    error = outcomes(events_of(run_dir))["pilot"].data["error"]
    assert error["type"] == "Timeout"
    assert "stage pilot timed out after 3 s" in error["message"]
    assert "in flight: the batch of 1 item(s) a2 (1 of 3 items recorded)" in error["message"]


def test_the_clock_is_off_outside_the_main_thread_and_says_so() -> None:
    import threading

    seen: list[str | None] = []
    thread = threading.Thread(target=lambda: seen.append(ItemClock(5).why_off))
    thread.start()
    thread.join(10)
    assert seen == ["the handler does not run in the main thread of its process"]
    assert ItemClock(0).why_off == "task.item_timeout_s is 0"
    assert DEFAULT_ITEM_TIMEOUT_S == 300


def test_a_failed_pilot_still_copies_its_evidence(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, task={"handler": "tinycheck:crash"},
                      results={"copy_to": str(tmp_path / "evidence")})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "manifest.yaml").write_text("name: tiny\n")  # the bot writes it there
    run_runner(spec, run_dir, env=runner_env(tmp_path / "project"), timeout=120)
    events = events_of(run_dir)
    stages = outcomes(events)
    assert stages["pilot"].type != "stage.passed" and events[-1].data["first_error"]
    assert stages["evidence"].type == "stage.passed"  # the most useful evidence: copied
    assert "the run failed before producing balance.json" in \
        stages["evidence"].data["facts"]["partial"]
    copy = tmp_path / "evidence" / "r-test"
    assert (copy / "events.jsonl").is_file() and (copy / "SHA256SUMS").is_file()
    assert events[-1].data["stage_reached"] != "evidence"  # not moved by the evidence stage


def test_a_volume_batch_gives_one_item_the_timeout_and_the_others_the_pilots_pace() -> None:
    """One hung input in a batch of 50 cost 50 item timeouts before its batch was
    interrupted; now one item timeout plus a margin over the pilot's pace for the others
    (issue 37)."""
    from runner.spec import ITEM_MARGIN, batch_clock_s

    assert batch_clock_s(50, 5.0) == 250.0  # without a pilot measure: the timeout each
    assert batch_clock_s(50, 5.0, 0.004) == pytest.approx(5.0 + 49 * ITEM_MARGIN * 0.004)
    assert batch_clock_s(50, 5.0, 10.0) == 250.0  # never more than the timeout an item
    assert batch_clock_s(1, 5.0, 0.004) == 5.0 and batch_clock_s(50, 0.0, 0.004) == 0.0
