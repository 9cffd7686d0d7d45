"""A Slack approval whose volume cannot be launched: refused in words, never a traceback or a
"something went wrong", and the pilot stays approvable (issue 27)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.slack.conftest import APPROVER, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import ReplayDispatcher, make_project
from tests.slack.test_decisions import finished_pilot, refusals


def test_a_volume_folder_gone_refuses_the_approval_and_the_pilot_stays_approvable(
        tmp_path: Path, emulator: SlackEmulator, make_harness: Any) -> None:
    h: Harness = make_harness(ReplayDispatcher(refused=()))
    ts, run = finished_pilot(h, emulator, make_project(tmp_path, volume=20, refused=()))
    volume_dir = tmp_path / "proj" / "data" / "volume"
    volume_dir.rename(volume_dir.with_name("volume-moved"))
    # "override": what is under test is the volume's check, whatever the pilot's verdict
    h.decide_via_modal(run["id"], "approve", "balance clean, override if needed",
                       user=APPROVER, thread_ts=ts)
    emulator.wait_for(lambda: refusals(h, run["id"]))
    assert "volume.inputs.dir" in refusals(h, run["id"])[0]["refusal"]
    emulator.wait_for(lambda: emulator.ephemerals)
    note = emulator.ephemerals[-1]["text"]
    assert "volume.inputs.dir" in note and "approve again" in note
    texts = " ".join(str(m.text) for m in emulator.messages.values())
    assert "Something went wrong" not in texts and "Traceback" not in texts
    assert h.store.get_run(run["id"])["status"] == "awaiting_decision"
    assert h.store.volume_of(run["id"]) is None
