"""Interconnect stage overhead: its all-reduce busbw vs a bare torch.distributed loop.

Both run gloo across 2 CPU processes on 127.0.0.1 with the same message sizes, warm-up and
iterations, in this one invocation, alternating (ours, bare, ours, bare, ...) so that load
from other jobs hits both alike; each side keeps its best busbw at the largest size. The
bare side is a plain ``init_process_group`` + ``all_reduce`` loop in two subprocesses; ours
is ``runner.collective.run_allreduce``, what the interconnect stage calls. Target: ours
reaches at least 0.9x the bare loop. The last line is the verdict.
Usage: .venv/bin/python bench/interconnect.py [ROUNDS]; PREFLIGHT_BENCH_SMOKE=1: one round of
small messages and few iterations (a smoke run that checks the bench runs to its verdict line).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from runner.cards import busbw  # noqa: E402
from runner.collective import run_allreduce  # noqa: E402

SMOKE = os.environ.get("PREFLIGHT_BENCH_SMOKE") == "1"
SIZES = [1 << 16, 1 << 20] if SMOKE else [1 << 20, 16 << 20]
ITERS, WARMUP, WORLD = (3, 1, 2) if SMOKE else (20, 3, 2)


def bare_rank(rank: int, port: int) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=WORLD)
    out = {}
    for size in SIZES:
        buf = torch.zeros(size // 4, dtype=torch.float32)
        for _ in range(WARMUP):
            dist.all_reduce(buf)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(ITERS):
            dist.all_reduce(buf)
        out[size] = (time.perf_counter() - t0) / ITERS
    dist.destroy_process_group()
    print(json.dumps(out))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def bare() -> float:
    port = free_port()
    procs = [subprocess.Popen([sys.executable, __file__, "--bare-rank", str(r), str(port)],
                              stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for r in range(WORLD)]
    results = [json.loads(p.communicate(timeout=300)[0]) for p in procs]
    largest = str(SIZES[-1])
    return busbw(SIZES[-1], max(r[largest] for r in results), WORLD)


def ours() -> float:
    result = run_allreduce(WORLD, sizes=SIZES, iters=ITERS, warmup=WARMUP, timeout_s=300)
    return float(result["busbw_gbps"])


def main() -> int:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else (1 if SMOKE else 3)
    best_ours = best_bare = 0.0
    for n in range(rounds):
        a, b = ours(), bare()
        best_ours, best_bare = max(best_ours, a), max(best_bare, b)
        print(f"round {n + 1}: stage {a:.3f} GB/s, bare loop {b:.3f} GB/s (busbw at "
              f"{SIZES[-1] >> 20} MiB, gloo, {WORLD} processes)")
    ratio = best_ours / best_bare if best_bare else 0.0
    print(f"best: stage {best_ours:.3f} GB/s, bare loop {best_bare:.3f} GB/s")
    print(f"interconnect_busbw_vs_bare: {ratio:.2f} (target 0.90) "
          f"{'PASS' if ratio >= 0.9 else 'MISS'}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--bare-rank":
        bare_rank(int(sys.argv[2]), int(sys.argv[3]))
        sys.exit(0)
    sys.exit(main())
