"""The cost of watching a run: ``preflight follow`` over a 20,000-item pilot.

One invocation, on this machine: a project with 20,000 one-line inputs and a trivial
handler (it accepts every item) runs with the local dispatcher, and a real
``preflight follow RUN`` process follows it from start to end with stdout to a file (not a
terminal: plain progress lines).

The follower's CPU is read from the kernel (``/proc/PID/stat``) every 50 ms while the run
goes on, so its parts are measured in the same process, at the same time, not by
subtracting other processes' figures (start-up and the report cost about 1 s each and
vary by 0.2-0.4 s from one process to the next on this machine: more than the quantity
measured). The watching window runs from the first item the runner wrote to the runner's
exit: the follower reads, records and displays the run as it goes. Its CPU over the items
the follower recorded in that window, per item, is the cost of watching; its start-up
(before the first item) and its end-of-run work are printed apart. The end-of-run work
that grows with the run, the bot's re-check of the balance over every recorded item, is
timed in this process on the database the follower wrote (median of 3) and counted in;
the report (report.html and its pictures, made once per run, again by `preflight report
RUN`) is not.

The handler is trivial but not free: about 1 ms of CPU per item (hashing), like a small
real handler; a handler that costs nothing would make any watcher look expensive.

Prints, per item: the follower's CPU while watching, the runner's parent's CPU, the rest of
the runner (the worker: the handler, the ledger, its events); then the watcher's share of
the run's CPU: (watching per item × items + the re-check) over the runner's CPU plus that
(target at most 2 %). ``BENCH_SHOW=1`` also prints what the follower printed.

Run from the repository root: ``.venv/bin/python bench/follow.py [ITEMS]``;
``PREFLIGHT_BENCH_SMOKE=1``: 3,000 items (a smoke run that checks the bench runs to its verdict
line, not the target). Exit 0 once the verdict is printed (PASS or MISS), 1 if the run
could not be measured.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
ITEMS = int(sys.argv[1]) if len(sys.argv) > 1 else (3000 if SMOKE else 20_000)
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


def start_run(service: Any, manifest: Path) -> tuple[str, int]:
    from bot.manifest.load import load_manifest_file

    run_id = service.submit(load_manifest_file(manifest), submitter="bench").run_id
    service.starter.start(run_id)
    return run_id, int(service.store.get_run(run_id)["pid"])


@dataclass
class Readings:
    """What the kernel and the state database said while the runner ran."""

    parent: float = 0.0               # the runner's parent's own CPU, last reading
    first_item: float | None = None   # the follower's CPU when the first item was written
    seq_first: int = 0                # the last seq the follower had recorded by then
    runner_exit: float = 0.0          # the follower's CPU at the last reading of the run
    seq_exit: int = 0                 # the last seq the follower had recorded by then


def watch(service: Any, run_id: str, runner: int, follower: int) -> Readings:
    """Read the CPU of the runner's parent and of the follower, and the last seq the
    follower recorded (one row: next to nothing for this process), every 50 ms until the
    runner ends; mark when the first item reached events.jsonl."""
    from bot.service.handles import handle_for

    out, tick = Readings(), threading.Event()
    run = service.store.run_record(run_id)
    handle, events = handle_for(run), run.run_dir / "events.jsonl"
    offset = 0
    while service.dispatchers["local"].is_alive(handle):
        parent, cpu = own_cpu(runner), own_cpu(follower)
        seq = service.store.run_head(run_id)["last_seq"]
        out.parent = parent if parent is not None else out.parent
        if out.first_item is None and events.exists():
            with open(events, "rb") as fh:
                fh.seek(max(0, offset - 16))
                fresh = fh.read()
            offset += len(fresh)
            if b'"item.' in fresh and cpu is not None:
                out.first_item, out.seq_first = cpu, seq
        if cpu is not None:
            out.runner_exit, out.seq_exit = cpu, seq
        tick.wait(0.05)
    return out


def recheck_seconds(service: Any, run_id: str) -> float:
    """CPU seconds of the bot's re-check of this run's balance (median of 3): what
    finishing a run costs per item, timed here on the database the follower wrote."""
    run = service.store.run(run_id)  # the typed record the follower reads
    record = service.store.run_record(run_id)
    balance = service.follower._recorded(record, "balance")  # the runner's balance event
    times = []
    for _ in range(3):
        start = time.process_time()
        service.follower._recheck_balance(run, balance)
        times.append(time.process_time() - start)
    return sorted(times)[1]


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
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        run_id, pid = start_run(service, manifest)
        with open(root / "follow.txt", "w") as fh:
            proc = subprocess.Popen([sys.executable, "-m", "bot", "follow", run_id], cwd=REPO,
                                    env=env, stdout=fh, stderr=subprocess.STDOUT)
            seen = watch(service, run_id, pid, proc.pid)
            _, status, usage = os.wait4(proc.pid, 0)
        code = os.waitstatus_to_exitcode(status)
        total = usage.ru_utime + usage.ru_stime
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        runner_cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime) - total
        run = service.store.get_run(run_id)
        lines = (root / "follow.txt").read_text().splitlines()
        if os.environ.get("BENCH_SHOW"):
            print("\n".join(lines))
        ms = 1000.0 / ITEMS
        print(f"run {run_id}: {run['status']} {run['outcome']}, follow exit {code}, "
              f"{len(lines)} lines printed while following")
        print(f"runner: {runner_cpu:.2f} s CPU ({runner_cpu * ms:.3f} ms/item); its parent "
              f"{seen.parent:.2f} s ({seen.parent * ms:.3f} ms/item), the worker and the rest "
              f"{runner_cpu - seen.parent:.2f} s")
        counted = service.store.db.execute(
            "SELECT count(*) FROM items WHERE run_key = (SELECT key FROM run_keys WHERE id = ?)"
            " AND seq > ? AND seq <= ?", [run_id, seen.seq_first, seen.seq_exit]).fetchone()[0]
        if code != 0 or run["outcome"] != "passed" or seen.first_item is None or counted <= 0:
            print((root / "follow.txt").read_text()[-3000:])
            print(f"could not measure: run {run['outcome']}, follow exit {code}, "
                  f"{counted} items seen recorded while it ran")
            service.close()
            return 1
        window = seen.runner_exit - seen.first_item
        per_item = window / counted
        recheck = recheck_seconds(service, run_id)
        service.close()
        print(f"preflight follow: {total:.2f} s CPU in all: {seen.first_item:.2f} s before the "
              f"first item (start-up, the diagnostics); {window:.2f} s watching "
              f"{counted} items as they were recorded ({per_item * 1000:.4f} ms/item); "
              f"{total - seen.runner_exit:.2f} s after the runner's exit (the last items, "
              f"re-check, verdict, report, output)")
        print(f"  the re-check over {ITEMS} items: {recheck:.3f} s "
              f"({recheck * ms:.4f} ms/item, timed here)")
        watcher = per_item * ITEMS + recheck
        share = watcher / (runner_cpu + watcher)
        verdict = "PASS" if share <= TARGET_SHARE else "MISS"
        print(f"watcher_cpu_share: {share * 100:.2f}% "
              f"(target <= {TARGET_SHARE * 100:.0f}%) {verdict}")
        return 0


if __name__ == "__main__":
    sys.exit(main())
