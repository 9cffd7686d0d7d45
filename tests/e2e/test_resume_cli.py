"""`preflight resume`: a runner killed mid-pilot, then resumed from its ledger."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

from runner.events import read_events
from tests.e2e.test_pilot_cli import preflight
from tests.processes import alive, wait_until

N = 8
SLOW_HANDLER = '''
import os, time

def handle(items, ctx):
    pilot = os.path.basename(ctx.outputs_dir) == "outputs"  # not the memory stage's dry run
    out = []
    for item in items:
        if pilot:
            with open("processed.log", "a") as log:  # the runner's cwd is the project
                log.write(item.id + "\\n")
            WAIT
        out.append({"id": item.id, "status": "accepted", "category": "invoice"})
    return out
'''


def slow_handler(wait: str) -> str:
    """A handler that logs each pilot item to processed.log, then runs ``wait``: one line,
    or several with the later ones indented as the first."""
    return SLOW_HANDLER.replace("WAIT", wait.replace("\n", "\n            "))


HANDLER = slow_handler("time.sleep(0.4)  # a slow item, so the test can kill the runner mid-pilot")
MANIFEST = f"""apiVersion: preflight/v1
name: slow
hardware: {{gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0"}}
backend: cpu
preparation: pytorch
inputs: {{dir: docs, pattern: "*.txt", expected_count: {N}}}
task: {{kind: custom, handler: "slow_handler:handle", categories: [invoice], batch_size: 1}}
success: {{min_accepted: {N}, max_refused: 0}}
approvals: {{approvers: [alice]}}
"""


def ledger_ids(run_dir: Path) -> set[str]:
    try:
        con = sqlite3.connect(f"file:{run_dir / 'ledger.sqlite'}?mode=ro", uri=True)
        try:
            return {r[0] for r in con.execute("SELECT id FROM items")}
        finally:
            con.close()
    except sqlite3.Error:  # not created yet
        return set()


def start_slow_pilot(tmp_path: Path, handler: str = HANDLER, *,
                     hold: bool = False) -> tuple[Path, Path, subprocess.Popen[str]]:
    """`preflight run` on a slow pilot, returned once two items are in the ledger.

    ``hold``: a file `hold` in the project, which a holding handler waits on."""
    root = tmp_path / "project"
    (root / "docs").mkdir(parents=True)
    for n in range(N):
        (root / "docs" / f"inv-{n}.txt").write_text(f"invoice {n}")
    (root / "slow_handler.py").write_text(handler)
    (root / "manifest.yaml").write_text(MANIFEST)
    if hold:
        (root / "hold").write_text("")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update({"PREFLIGHT_HOME": str(root)})
    cli = subprocess.Popen([sys.executable, "-m", "bot", "run", "manifest.yaml"], cwd=root,
                           env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                           stdin=subprocess.DEVNULL)
    runs = root / "runs"
    wait_until(lambda: runs.exists() and any(runs.iterdir()), "the run directory", 60)
    (run_dir,) = list(runs.iterdir())
    wait_until(lambda: len(ledger_ids(run_dir)) >= 2, "two items in the ledger", 120)
    return root, run_dir, cli


def test_ctrl_c_stops_following_not_the_runner(tmp_path: Path) -> None:
    root, run_dir, cli = start_slow_pilot(tmp_path)
    cli.send_signal(signal.SIGINT)
    out, err = cli.communicate(timeout=60)
    assert cli.returncode == 130, out + err
    # one line: where it goes on, how to follow it again or stop it (issue 37, point 8)
    assert f"stopped following {run_dir.name}; the run goes on: preflight follow " \
           f"{run_dir.name} / preflight stop {run_dir.name} --reason \"…\"\n" in err
    followed = preflight(root, "follow", run_dir.name)
    assert followed.returncode == 0, followed.stdout + followed.stderr
    assert "Verdict: PASSED" in followed.stdout
    listed = json.loads(preflight(root, "runs", "--json").stdout)
    assert [(r["status"], r["outcome"]) for r in listed] == [("awaiting_decision", "passed")]


def test_runs_brings_an_unfollowed_run_up_to_date(tmp_path: Path) -> None:
    root, run_dir, cli = start_slow_pilot(tmp_path)
    cli.send_signal(signal.SIGINT)
    cli.communicate(timeout=60)
    pid = int((run_dir / "runner.pid").read_text())
    wait_until(lambda: not alive(pid), "the runner to end on its own", 120)
    listed = json.loads(preflight(root, "runs", "--json").stdout)
    assert [(r["status"], r["outcome"]) for r in listed] == [("awaiting_decision", "passed")]


def test_killed_runner_is_resumed_without_redoing_finished_items(tmp_path: Path) -> None:
    root, run_dir, cli = start_slow_pilot(tmp_path)
    pid = int((run_dir / "runner.pid").read_text())
    os.killpg(pid, signal.SIGKILL)
    out, err = cli.communicate(timeout=120)
    assert cli.returncode == 1, out + err
    assert "RunnerExited" in out
    done_before = ledger_ids(run_dir)
    assert 2 <= len(done_before) < N
    processed_before = (root / "processed.log").read_text().split()

    resumed = preflight(root, "resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert "Verdict: PASSED" in resumed.stdout
    balance = json.loads((run_dir / "balance.json").read_text())
    assert (balance["accepted"], balance["refused"], balance["ok"]) == (N, 0, True)
    processed_after = (root / "processed.log").read_text().split()[len(processed_before):]
    assert not set(processed_after) & done_before  # finished items never ran again
    assert set(processed_after) | done_before == {f"inv-{n}" for n in range(N)}
    events = read_events(str(run_dir / "events.jsonl"))[0]  # item batches expanded
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    items = [e.data["id"] for e in events if e.type == "item.done"]
    assert sorted(items) == sorted(f"inv-{n}" for n in range(N))  # each exactly once
    db = sqlite3.connect(root / "state" / "preflight.db")
    assert db.execute("SELECT status, outcome FROM runs").fetchone() == (
        "awaiting_decision", "passed")
    assert db.execute("SELECT count(*), count(DISTINCT item_id) FROM items").fetchone() == (N, N)
