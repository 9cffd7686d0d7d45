"""Evidence of many small outputs: shards vs the per-file copy, same run, same destination disk.

Makes a run directory with N small JSON outputs (and the files a run has), then copies
its evidence twice with ``runner.evidence.copy_evidence``: once file by file (the copy
every run made before issue 35: an fsync per file, each read back), once in shards (the
default above 1,000 outputs: tar shards of 10,000, 4 written at a time, one fsync each,
read back shard by shard). Both copies must verify. Prints the wall time and ms/output
of each (and of `preflight verify` on the sharded copy, every member) and the ratio; the
last line is the verdict (target: shards at least 10x faster at 100,000 outputs).
Usage: .venv/bin/python bench/evidence.py [N]; PREFLIGHT_BENCH_SMOKE=1: 2,000 outputs (a
smoke run that checks the bench runs to its verdict line, not the target).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.evidence import copy_evidence, verify_evidence  # noqa: E402

TARGET = 10.0
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
SPEC = {"run_id": "bench", "inputs": {"dir": "/in", "expected_count": 0},
        "project": {"params": {}}, "task": {"kind": "classify", "params": {}}}


def make_run(root: str, n: int) -> str:
    run = os.path.join(root, "run")
    os.makedirs(os.path.join(run, "outputs"))
    docs = {"manifest.yaml": "name: bench\n", "spec.json": json.dumps(SPEC),
            "environment.json": "{}\n", "events.jsonl": '{"seq": 1}\n',
            "balance.json": json.dumps({"ok": True, "run": "bench"})}
    for name, text in docs.items():
        with open(os.path.join(run, name), "w", encoding="utf-8") as fh:
            fh.write(text)
    with open(os.path.join(run, "balance.csv"), "w", encoding="utf-8") as csv:
        csv.write("id,status,category,reason,output\n")
        for i in range(n):
            rel = f"outputs/doc-{i:07d}.json"
            with open(os.path.join(run, rel), "w", encoding="utf-8") as fh:
                fh.write(json.dumps({"id": f"doc-{i:07d}", "category": "invoice",
                                     "score": i % 97 / 97}))
            csv.write(f"doc-{i:07d},accepted,invoice,,{rel}\n")
    return run


def timed_copy(run: str, dest: str, n: int, plain: bool) -> float:
    t0 = time.perf_counter()
    report = copy_evidence(run, dest, plain_max=n + 1 if plain else 1000)
    seconds = time.perf_counter() - t0
    if not report.verified:
        raise SystemExit(f"the {'per-file' if plain else 'sharded'} copy does not verify: "
                         f"{report.problems[:3]}")
    if report.files != n + 6:
        raise SystemExit(f"{report.files} files copied, {n + 6} expected")
    return seconds


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else (2_000 if SMOKE else 100_000)
    root = tempfile.mkdtemp(prefix="preflight-bench-evidence-")
    try:
        t0 = time.perf_counter()
        run = make_run(root, n)
        print(f"{n:,} outputs made in {time.perf_counter() - t0:.1f} s ({root})")
        sharded = os.path.join(root, "sharded")
        shards = timed_copy(run, sharded, n, plain=False)
        print(f"shards:   {shards:8.2f} s  {1000 * shards / n:.3f} ms/output "
              "(copy and read-back)")
        t0 = time.perf_counter()
        if not verify_evidence(sharded).ok:
            raise SystemExit("preflight verify refuses the sharded copy")
        seconds = time.perf_counter() - t0
        print(f"verify:   {seconds:8.2f} s  {1000 * seconds / n:.3f} ms/output "
              "(preflight verify of the sharded copy: every member against the index)")
        plain = timed_copy(run, os.path.join(root, "per-file"), n, plain=True)
        print(f"per-file: {plain:8.2f} s  {1000 * plain / n:.3f} ms/output "
              "(copy and read-back)")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = plain / shards if shards > 0 else float("inf")
    verdict = "PASS" if ratio >= TARGET else "MISS"
    print(f"evidence_shards_speedup: {ratio:.1f}x (target >= {TARGET:g}x at 100,000 outputs, "
          f"measured at {n:,}) {verdict}")


if __name__ == "__main__":
    main()
