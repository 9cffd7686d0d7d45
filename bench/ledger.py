"""Ledger throughput: 1,000,000 no-op items through the runner's ledger vs bare executemany.

Prints items/s for both (same process, same rows, same WAL settings), the ratio (target:
the ledger reaches at least 80% of the bare rate), and how long a resume takes to find
the remaining items among 1,000,000 (target: under 0.5 s). The last line is the verdict
(both targets).
Usage: .venv/bin/python bench/ledger.py [N]; PREFLIGHT_BENCH_SMOKE=1: 20,000 items (a smoke run
that checks the bench runs to its verdict line, not the target).
"""

from __future__ import annotations

import os
import sqlite3
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.ledger import SCHEMA, Ledger, Row  # noqa: E402

BATCH = 1000
RATIO_TARGET, SCAN_TARGET_S = 0.8, 0.5
SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"


def bare(path: str, ids: list) -> float:
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.executescript(SCHEMA)
    t0 = time.perf_counter()
    conn.execute("BEGIN")
    conn.executemany("INSERT INTO items(id, status, category, reason, output, attempt) "
                     "VALUES (?, ?, ?, ?, ?, ?)",
                     [(i, "accepted", "x", None, None, 1) for i in ids])
    conn.execute("COMMIT")
    dt = time.perf_counter() - t0
    conn.close()
    return dt


def through_ledger(path: str, ids: list) -> float:
    led = Ledger.open(path, new_attempt=True)
    t0 = time.perf_counter()
    for start in range(0, len(ids), BATCH):
        led.record([Row(i, "accepted", category="x") for i in ids[start:start + BATCH]])
    dt = time.perf_counter() - t0
    led.close()
    return dt


def resume_scan(path: str, ids: list) -> tuple[float, int]:
    t0 = time.perf_counter()
    led = Ledger.open(path, new_attempt=True)
    done = led.done_ids()
    remaining = [i for i in ids if i not in done]
    led.close()
    return time.perf_counter() - t0, len(remaining)


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else (20_000 if SMOKE else 1_000_000)
    ids = [f"item-{k:07d}" for k in range(n)]
    with tempfile.TemporaryDirectory() as tmp:
        t_bare = bare(os.path.join(tmp, "bare.sqlite"), ids)
        t_led = through_ledger(os.path.join(tmp, "ledger.sqlite"), ids)
        extra = [f"item-{k:07d}" for k in range(n, n + 1000)]  # 1,000 not yet done
        t_scan, left = resume_scan(os.path.join(tmp, "ledger.sqlite"), ids + extra)
    r_bare, r_led = n / t_bare, n / t_led
    ratio = r_led / r_bare
    print(f"bare executemany: {n} rows in {t_bare:.2f} s = {r_bare:,.0f} items/s")
    print(f"ledger (batches of {BATCH}, one transaction each): {t_led:.2f} s = "
          f"{r_led:,.0f} items/s")
    print(f"resume scan: {left} remaining found among {n + len(extra)} in {t_scan:.2f} s "
          f"(target < {SCAN_TARGET_S} s) {'PASS' if t_scan < SCAN_TARGET_S else 'MISS'}")
    assert left == len(extra), (left, len(extra))
    ok = ratio >= RATIO_TARGET and t_scan < SCAN_TARGET_S
    print(f"ledger_vs_bare_ratio: {ratio:.2f} (target >= {RATIO_TARGET:.2f}, resume scan "
          f"< {SCAN_TARGET_S} s) {'PASS' if ok else 'MISS'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
