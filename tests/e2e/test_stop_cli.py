"""`preflight stop`: a running pilot stopped with who and why, then resumed from its ledger."""

from __future__ import annotations

import json
import sqlite3
import subprocess
from pathlib import Path

from tests.e2e.test_pilot_cli import preflight
from tests.e2e.test_resume_cli import N, ledger_ids, slow_handler, start_slow_pilot
from tests.processes import live_processes

# Items after the second wait while the file `hold` exists: the run is mid-pilot for as
# long as the test needs, and a resume (after removing `hold`) goes through at once.
HANDLER = slow_handler('while int(item.id.split("-")[1]) >= 2 and os.path.exists("hold"):\n'
                       "    time.sleep(0.05)")


def start_held_pilot(tmp_path: Path) -> tuple[Path, Path, subprocess.Popen[str]]:
    return start_slow_pilot(tmp_path, HANDLER, hold=True)


def group_alive(pgid: int) -> bool:
    return any(p.pgid == pgid for p in live_processes())


def test_stop_then_resume_keeps_the_finished_items(tmp_path: Path) -> None:
    root, run_dir, cli = start_held_pilot(tmp_path)
    pid = int((run_dir / "runner.pid").read_text())
    stopped = preflight(root, "stop", run_dir.name[:12], "--reason", "wrong inputs folder",
                        "--by", "alice")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert "is stopped" in stopped.stdout and f"preflight resume {run_dir.name}" in stopped.stdout
    assert not group_alive(pid)  # the runner and everything it started
    out, err = cli.communicate(timeout=120)  # the `run` that followed it sees it end
    assert cli.returncode == 1, out + err
    db = sqlite3.connect(root / "state" / "preflight.db")
    status, stop = db.execute("SELECT status, stop FROM runs").fetchone()
    db.close()
    assert status == "stopped"
    assert json.loads(stop)["by"] == "alice" and json.loads(stop)["reason"] == "wrong inputs folder"
    done_before = ledger_ids(run_dir)
    assert len(done_before) == 2
    shown = preflight(root, "show", run_dir.name)
    assert "Stopped by     alice" in shown.stdout and "wrong inputs folder" in shown.stdout
    assert "Approve scale-up" not in shown.stdout  # a stopped run offers no decision
    again = preflight(root, "stop", run_dir.name, "--reason", "twice", "--by", "alice")
    assert again.returncode == 1 and "only a running run can be stopped" in again.stderr

    (root / "hold").unlink()
    resumed = preflight(root, "resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    balance = json.loads((run_dir / "balance.json").read_text())
    assert (balance["accepted"], balance["refused"], balance["ok"]) == (N, 0, True)
    processed = (root / "processed.log").read_text().split()
    assert sorted(set(processed)) == sorted(f"inv-{n}" for n in range(N))
    assert all(processed.count(i) == 1 for i in done_before)  # finished items never ran again
