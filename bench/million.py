"""A million outputs end to end, on two simulated SSH nodes (issue 35, point 8).

Everything runs in this invocation, on this machine: two real sshd's on 127.0.0.1 (two
"nodes", generated keys, one host), the bot's service in this process (its real SQLite
store, the SSH dispatcher, the follower), the real runner and a real Ray cluster of two
nodes started by the dispatcher. What is simulated: the nodes share one host (and one
disk), and the corpus lies on storage both see at the same path (``volume.inputs.on_nodes``
without ``dir``: a corpus only the nodes hold, the head lists it, every node is held to the
head's listing). The handler is light: each input's text read, a category by parity, and
a small JSON output each.

Phases, each timed: the pilot (12 inputs, its node dispatch included), the approval, the
volume (dispatch, Ray, processing, balance, evidence, the bot's fetch and report), then
``preflight verify`` of the fetched evidence copy. Checked: the volume's verdict PASSED,
its balance counts every input once, ``verify`` passes, the bot's peak RSS (this process:
the service, its follower and fetch) under 1 GB, report.html at most 5 MB.

Target (issue 35): everything after the approval within 15 min for 1,000,000 inputs on
this 2-core machine. ``PREFLIGHT_MILLION_N`` sets the count (default 1,000,000);
``PREFLIGHT_BENCH_SMOKE=1`` runs 2,000 (checks the bench runs to its verdict line).
Run from the repository root: ``.venv/bin/python bench/million.py``.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
COUNT = 2_000 if SMOKE else int(os.environ.get("PREFLIGHT_MILLION_N", "1000000"))
TARGET_S = 15 * 60 * COUNT / 1_000_000  # the 15 min for a million, pro rata
RSS_CAP_MB = 1024
REPORT_CAP_MB = 5.0
PILOT = 12

HANDLER = '''
def handle(items, ctx):
    out = []
    for it in items:
        with open(it.path, encoding="utf-8") as fh:
            text = fh.read()
        n = int(it.id.split("-")[1])
        out.append({"id": it.id, "status": "accepted", "category": "odd" if n % 2 else "even",
                    "output": {"n": n, "chars": len(text)}})
    return out
'''


def write_corpus(folder: Path, count: int) -> None:
    folder.mkdir(parents=True)
    for n in range(count):
        with open(folder / f"item-{n:07d}.txt", "w", encoding="utf-8") as fh:
            fh.write(f"item {n}")


def write_project(root: Path, corpus: Path, nodes: list[dict[str, object]]) -> Path:
    (root / "pilot").mkdir(parents=True)
    for n in range(PILOT):
        (root / "pilot" / f"item-{n:07d}.txt").write_text(f"item {n}", encoding="utf-8")
    (root / "light.py").write_text(HANDLER, encoding="utf-8")
    manifest = {
        "apiVersion": "preflight/v1", "name": "million", "purpose": "inference",
        "hardware": {"gpu": "cpu", "lots": 1, "days": 3, "lot_price_usd_per_day": "0"},
        "backend": "cpu", "preparation": "pytorch", "node": nodes[0],
        "inputs": {"dir": "pilot", "pattern": "item-*.txt", "expected_count": PILOT},
        "task": {"kind": "classify", "handler": "light:handle", "batch_size": 4,
                 "categories": ["even", "odd"]},
        "success": {"min_accepted": PILOT, "max_refused": 0, "balance_ok": True},
        "approvals": {"approvers": ["alice"]},
        "results": {"copy_to": str(root / "evidence")},
        "volume": {"inputs": {"on_nodes": str(corpus), "pattern": "item-*.txt",
                              "expected_count": COUNT},
                   "nodes": nodes, "batch_size": 500},
    }
    path = root / "manifest.yaml"
    path.write_text(json.dumps(manifest, indent=2), encoding="utf-8")
    return path


def phases(events: list[object]) -> dict[str, float]:
    """Each stage's duration (s) from the volume's recorded stage events."""
    out: dict[str, float] = {}
    for e in events:
        data = getattr(e, "data", {}) or {}
        if getattr(e, "type", "") in ("stage.passed", "stage.failed") and "stage" in data:
            out[str(data["stage"])] = float(data.get("seconds") or 0.0)
    return out


def main() -> int:
    from bot.manifest.load import load_manifest_file
    from tests.remote.remote_kit import provision
    from tests.remote.sshd_server import missing, running_sshd
    from tests.remote.volume_service_kit import (
        TwoNodesOneHost,
        compose,
        dispatcher_for,
        stop_everything,
    )

    lacking = missing()
    if lacking:  # a system dependency, named in the verdict line (no traceback)
        print(f"million_after_approval_s: n/a (target <= {TARGET_S:.0f} at {COUNT:,} inputs; "
              f"not run: {lacking}) MISS")
        return 1  # not measured

    with tempfile.TemporaryDirectory(prefix="million-") as tmp_name:
        tmp = Path(tmp_name)
        t0 = time.perf_counter()
        write_corpus(tmp / "corpus", COUNT)
        print(f"corpus: {COUNT:,} inputs written in {time.perf_counter() - t0:.1f} s "
              "(not counted)", flush=True)
        with running_sshd(tmp / "sshd0") as sshd, running_sshd(tmp / "sshd1") as sshd2:
            layout = TwoNodesOneHost([tmp / "node0", tmp / "other" / "node1"])
            nodes = [s.node(w, python=sys.executable) for s, w in
                     zip((sshd, sshd2), layout.workdirs)]
            manifest = write_project(tmp / "project", tmp / "corpus", nodes)
            dispatcher = dispatcher_for([sshd, sshd2], layout, tmp / "known_hosts")
            service = compose(tmp / "home", dispatcher)
            try:
                for s in (sshd, sshd2):
                    provision(service.store, s.lease_key)
                t = time.perf_counter()
                pilot = service.submit(load_manifest_file(manifest), submitter="bob").run_id
                service.starter.start(pilot)
                run = service.follower.follow(pilot, timeout=900)
                pilot_s = time.perf_counter() - t
                if (run["status"], run["outcome"]) != ("awaiting_decision", "passed"):
                    print(f"the pilot did not pass: {run['first_error']}")
                    print("million_after_approval_s: n/a (target ≤ 900 at 1M) MISS")
                    return 1
                t = time.perf_counter()
                volume = service.decider.decide(pilot, "approve", "bench", "alice")["volume_run"]
                run = service.follower.follow(volume, timeout=6 * 3600)
                after_s = time.perf_counter() - t
                # the stage events only: the volume's million item events stay in the store
                events = service.store.events_of_type(volume, "stage.passed")
            finally:
                stop_everything(service, layout.groups)
        rss_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        run_dir = Path(run["run_dir"])
        report = run_dir / "report.html"
        report_mb = report.stat().st_size / 1e6 if report.exists() else float("inf")
        evidence = (run.get("evidence") or {}).get("dest")
        t = time.perf_counter()
        verified = evidence is not None and subprocess.run(
            [sys.executable, "-m", "bot", "verify", str(evidence)], cwd=REPO,
            capture_output=True, text=True, check=False).returncode == 0
        verify_s = time.perf_counter() - t
        balance = run.get("balance") or {}
        print(f"pilot ({PILOT} inputs, dispatch included): {pilot_s:.1f} s")
        for stage, seconds in phases(events).items():
            print(f"  volume stage {stage}: {seconds:.1f} s")
        print(f"after the approval (volume, fetch, report): {after_s:.1f} s for {COUNT:,} "
              f"inputs ({COUNT / max(after_s, 1e-9):,.0f} inputs/s)")
        print(f"preflight verify of the fetched evidence: {verify_s:.1f} s, "
              f"{'passed' if verified else 'FAILED'}")
        print(f"verdict: {run['outcome']}; balance total {balance.get('total')}, "
              f"accepted {balance.get('accepted')}, refused {balance.get('refused')}")
        print(f"bot peak RSS: {rss_mb:.0f} MB (cap {RSS_CAP_MB}); report.html "
              f"{report_mb:.2f} MB (cap {REPORT_CAP_MB})")
        ok = (run["outcome"] == "passed" and balance.get("total") == COUNT and verified
              and rss_mb < RSS_CAP_MB and report_mb <= REPORT_CAP_MB)
        passed = ok and after_s <= TARGET_S
        print(f"million_after_approval_s: {after_s:.1f} (target <= {TARGET_S:.0f} at "
              f"{COUNT:,} inputs, verdict passed, verify, RSS < 1 GB, report <= 5 MB) "
              f"{'PASS' if passed else 'MISS'}")
        return 0 if ok or SMOKE else 1


if __name__ == "__main__":
    sys.exit(main())
