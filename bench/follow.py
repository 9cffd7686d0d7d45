"""The cost of watching a run: ``preflight follow`` over a 20,000-item pilot.

One invocation, on this machine: a project with 20,000 one-line inputs and a trivial
handler (it accepts every item) runs with the local dispatcher, and a real
``preflight follow RUN`` process follows it from start to end with stdout to a file (not a
terminal: plain progress lines). The watcher's CPU for the run is that process's CPU minus
its start-up (measured in the same invocation: following the finished run again). To say
where it goes, the same run is also run unwatched and its events read once at its end by
one ``preflight follow``: recording every event, the re-check, the verdict and the report
are the bot's work either way; what watching live adds is the difference. CPU seconds
come from the kernel (``wait4`` for each follow process, ``RUSAGE_CHILDREN`` for the
runner, ``/proc`` for the runner's parent alone).

The handler is trivial but not free: about 1 ms of CPU per item (hashing), like a small
real handler; a handler that costs nothing would make any watcher look expensive.

Prints, per item: the follower's CPU, the runner's parent's CPU, the rest of the runner
(the worker: the handler, the ledger, its events); then the watcher's share of the run's
CPU: the follower's CPU for the run (its start-up and the end-of-run report aside, both
measured here, once per run whatever its size) over the runner's plus that (target at
most 2 %). ``BENCH_SHOW=1`` also prints what the follower printed.

Run from the repository root: ``.venv/bin/python bench/follow.py [ITEMS]``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ITEMS = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000
TARGET_SHARE = 0.02
TICK = os.sysconf("SC_CLK_TCK")

# Trivial, but not free: about 1 ms of CPU per item (hashing), like a small real handler.
HANDLER = '''
import hashlib

def handle(batch, ctx):
    out = []
    for item in batch:
        digest = item.id.encode()
        for _ in range(1200):
            digest = hashlib.sha256(digest).digest()
        out.append({"id": item.id, "status": "accepted", "category": "ok"})
    return out
'''


def write_project(root: Path, count: int) -> Path:
    data = root / "data"
    data.mkdir(parents=True)
    for n in range(count):
        (data / f"item-{n:06d}.txt").write_text("x\n")
    (root / "trivial.py").write_text(HANDLER)
    manifest = {
        "apiVersion": "preflight/v1", "name": "follow-bench", "purpose": "inference",
        "hardware": {"gpu": "cpu", "lots": 1, "days": 3, "lot_price_usd_per_day": "0"},
        "backend": "cpu", "preparation": "pytorch", "node": {"kind": "local"},
        "project": {"dir": "."},
        "inputs": {"dir": "data", "pattern": "item-*.txt", "expected_count": count,
                   "expected_refusals": []},
        "task": {"kind": "classify", "handler": "trivial:handle", "categories": ["ok"],
                 "batch_size": 32},
        "diagnostics": {"min_free_disk_gib": 0.1},
        "success": {"min_accepted": count, "max_refused": 0, "balance_ok": True},
        "approvals": {"approvers": ["bench"]},
    }
    path = root / "manifest.yaml"
    path.write_text(json.dumps(manifest, indent=2))
    return path


def own_cpu(pid: int) -> float | None:
    """utime + stime of one process (its children not counted), or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICK


def follow(run_id: str, env: dict[str, str], out: Path,
           command: str = "follow") -> tuple[int, float]:
    """Run ``preflight follow RUN``; its exit code and CPU seconds (from wait4)."""
    with open(out, "w") as fh:
        proc = subprocess.Popen([sys.executable, "-m", "bot", command, run_id], cwd=REPO,
                                env=env, stdout=fh, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return proc.returncode, usage.ru_utime + usage.ru_stime


def start_run(service: Any, manifest: Path) -> tuple[str, int]:
    from bot.manifest.load import load_manifest_file

    run_id = service.submit(load_manifest_file(manifest), submitter="bench").run_id
    service.start(run_id)
    return run_id, int(service.store.get_run(run_id)["pid"])


def wait_runner(service: Any, run_id: str, pid: int) -> float:
    """Wait for the runner to end; the CPU of its parent alone (last reading before it ended)."""
    parent, gone = 0.0, threading.Event()
    handle = service._handle(service.store.get_run(run_id))
    while service.dispatchers["local"].is_alive(handle):
        value = own_cpu(pid)
        parent = value if value is not None else parent
        gone.wait(0.05)
    return parent


def main() -> int:
    from bot.compose import make_service
    from bot.messages.model import NullNotifier
    from bot.settings import Settings

    with tempfile.TemporaryDirectory(prefix="bench-follow-") as tmp:
        root = Path(tmp)
        manifest = write_project(root / "project", ITEMS)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
        env["PREFLIGHT_HOME"] = str(root / "home")
        service = make_service(Settings.from_env(env), NullNotifier())
        # 1. Watched live: a follower from the start of the run to its end.
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run_id, pid = start_run(service, manifest)
        result: dict[str, tuple[int, float]] = {}
        watcher = threading.Thread(target=lambda: result.update(
            live=follow(run_id, env, root / "follow-live.txt")))
        watcher.start()
        parent = wait_runner(service, run_id, pid)
        watcher.join()
        code, live = result["live"]
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runner_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) - live
        # 2. Start-up alone: following the finished run again (reads the state, prints it).
        _, startup = follow(run_id, env, root / "follow-again.txt")
        # The end-of-run report (report.html and its pictures) is made once per run by
        # whoever finishes it; `preflight report RUN` makes it again, alone.
        _, report = follow(run_id, env, root / "report.txt", "report")
        report = max(0.0, report - startup)
        # 3. The baseline: the same run unwatched, its events read once at the end by one
        #    follower (what the bot must do anyway: record every event, judge, report).
        second, pid2 = start_run(service, manifest)
        wait_runner(service, second, pid2)
        code2, once = follow(second, env, root / "follow-once.txt")
        run = service.store.get_run(run_id)
        service.close()
        lines = (root / "follow-live.txt").read_text().splitlines()
        if os.environ.get("BENCH_SHOW"):
            print("\n".join(lines))
        ms = 1000.0 / ITEMS
        watching = max(0.0, live - once)
        # the follower's CPU for this run, its start-up and the report aside
        whole = max(0.0, live - startup - report)
        print(f"run {run_id}: {run['status']} {run['outcome']}, follow exit {code} "
              f"(baseline run: exit {code2}), {len(lines)} lines printed while following")
        print(f"runner: {runner_cpu:.2f} s CPU ({runner_cpu * ms:.3f} ms/item); its parent "
              f"{parent:.2f} s ({parent * ms:.3f} ms/item), the worker and the rest "
              f"{runner_cpu - parent:.2f} s")
        print(f"preflight follow: {live:.2f} s CPU watching live; {once:.2f} s reading the "
              f"same run once at its end; {startup:.2f} s start-up alone; the end-of-run "
              f"report {report:.2f} s")
        print(f"  recording, judging and drawing: {whole:.2f} s ({whole * ms:.4f} ms/item); "
              f"watching live adds {watching:.2f} s ({watching * ms:.4f} ms/item) to reading "
              f"the run once")
        if code != 0 or run["outcome"] != "passed":
            print((root / "follow-live.txt").read_text()[-3000:])
            print(f"watcher share of the run's CPU: n/a (run {run['outcome']}) MISS")
            return 1
        share = whole / (runner_cpu + whole)
        verdict = "PASS" if share <= TARGET_SHARE else "MISS"
        print(f"watcher share of the run's CPU: {share * 100:.2f}% "
              f"(target {TARGET_SHARE * 100:.0f}%) {verdict}")
        return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    sys.exit(main())
