"""The volume forecast in Slack: in the thread and the Approve modal; a volume that ends
after the lease is refused unless the approver overrides (recorded as such)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.slack.conftest import APPROVER, CHANNEL, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project
from tests.slack.test_decisions import finished_pilot, refusals


def test_a_volume_past_the_lease_needs_an_override_from_the_modal(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(refused=(), seconds=0.5))
    text = make_project(tmp_path, volume=20, refused=(), lease_starts_at="2020-01-01T00:00:00Z")
    ts, run = finished_pilot(h, emulator, text)
    assert run["forecast"]["fits"] is False
    # the report and the picture go to the thread with the verdict (files_upload_v2)
    emulator.wait_for(lambda: len([f for f in emulator.files.values()
                                   if f.get("thread_ts") == ts]) == 2)
    uploaded = {f["name"]: f for f in emulator.files.values() if f.get("thread_ts") == ts}
    assert set(uploaded) == {"report.html", "report-summary.png"}
    assert all(f["channel"] == CHANNEL for f in uploaded.values())
    assert b"Forecast of the volume" in uploaded["report.html"]["content"]
    assert [c.method for c in emulator.calls if c.method.startswith("files.")].count(
        "files.completeUploadExternal") == 2
    ref = h.store.message_ref(run["id"], "forecast", "slack")["ref"]
    shown = str(emulator.messages[(CHANNEL, ref)].blocks)
    assert "20 items × 0.5 s mean ÷ 1 worker = 10 s" in shown and "AFTER the lease" in shown
    h.click("approve", run["id"], user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: emulator.views)
    modal = str(next(iter(emulator.views.values()))["blocks"])
    assert "AFTER the lease" in modal and "Lease ends" in modal and "override" in modal
    assert "Workers: *1*" in modal and "Setup: *" in modal   # what the wall time stands on
    h.decide_via_modal(run["id"], "approve", "pilot passed", user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: refusals(h, run["id"]))
    assert "after the lease ends" in refusals(h, run["id"])[0]["refusal"]
    emulator.wait_for(lambda: emulator.ephemerals)
    assert "refused" in emulator.ephemerals[-1]["text"]
    assert h.store.get_run(run["id"])["status"] == "awaiting_decision"
    h.decide_via_modal(run["id"], "approve", "override: the lease is extended by a week",
                       user=APPROVER, thread_ts=ts)
    decided = h.decided(run["id"])
    accepted = [d for d in h.store.decisions(decided["id"]) if d["accepted"]]
    assert accepted[0]["override"] == 1 and "after the lease" in accepted[0]["override_of"]
    ref = h.store.message_ref(run["id"], "decision", "slack")["ref"]
    assert "override: the volume" in str(emulator.messages[(CHANNEL, ref)].blocks)
    emulator.wait_for(lambda: [r for r in h.store.list_runs() if r["kind"] == "volume"])
    volume = next(r for r in h.store.list_runs() if r["kind"] == "volume")
    # its work stage against one Ray start + the processing of its 20 items
    assert h.settle(volume["id"])["forecast"]["forecast_mid_s"] == 4.6 + 10.0
