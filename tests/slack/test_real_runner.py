"""The 12-document pilot with the real runner process, from mention to decision."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle
from bot.nodes.local import LocalDispatcher
from bot.settings import Settings
from tests.slack.conftest import APPROVER, CHANNEL, Harness
from tests.slack.emulator import SlackEmulator
from tests.slack.fakes import make_project


def test_real_pilot_in_one_thread(tmp_path: Path, emulator: SlackEmulator,
                                  make_harness: Any) -> None:
    text = make_project(tmp_path, real_docs=True)
    local = LocalDispatcher(sys.executable, env=dict(Settings.from_env().runner_env))
    h: Harness = make_harness(local)
    ts, (status, _) = h.mention(f"```yaml\n{text}```")
    assert status == 200
    emulator.wait_for(lambda: h.store.list_runs())
    run = h.settle(h.store.list_runs()[0]["id"], timeout=120)
    assert run["status"] == "awaiting_decision", run.get("first_error")
    assert run["balance"]["total"] == 12
    assert run["balance"]["accepted"] + run["balance"]["refused"] == 12
    thread = emulator.thread(CHANNEL, ts)[1:]
    keys = ("plan", "status", "balance", "verdict", "decision")
    refs = [h.store.message_ref(run["id"], k, "slack") for k in keys]
    assert all(refs), dict(zip(keys, refs))
    assert {r["ref"] for r in refs} <= {m.ts for m in thread}
    assert len(thread) == len({m.ts for m in thread})
    status_msg = emulator.messages[(CHANNEL, refs[1]["ref"])]
    assert "*pilot* passed" in str(status_msg.blocks)
    h.decide_via_modal(run["id"], "revise", "compare with the next attempt", user=APPROVER,
                       thread_ts=ts)
    assert h.wait_status(run["id"], ("decided",))["status"] == "decided"
    assert not [c for c in emulator.calls if c.error]
    reap(h, run)


def reap(h: Harness, run: dict[str, Any]) -> None:
    """Wait for the runner process to be reaped (no Popen left running at teardown)."""
    handle = RunHandle(run["id"], Path(run["run_dir"]), Path(run["spec_path"]),
                       Path(run["project_dir"]), run.get("pid"))
    deadline = time.monotonic() + 60
    while h.dispatcher.exit_code(handle) is None:
        assert time.monotonic() < deadline, "the runner did not exit"
        threading.Event().wait(0.05)  # poll the exit status with a deadline
