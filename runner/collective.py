"""All-reduce over several processes through torch.distributed, one process per card.

``run_allreduce`` (the parent side, used by the interconnect stage and the bench) hosts
the rendezvous store itself on a free port of 127.0.0.1, starts one rank process per card
(NCCL on CUDA, which is RCCL on ROCm builds; gloo on CPU), reads each rank's JSON lines,
and returns the per-size timings. It never hangs: a rank that exits early fails the
measurement at once naming the rank, its card and its last stderr lines, and past
``timeout_s`` every rank is killed and the silent ones are named.

Standard library only at import time; ranks import torch in ``rank_main``.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from runner.cards import busbw

_BOOT = ("import sys, json; sys.path[:] = json.loads(sys.argv[1]); "
         "from runner.collective import rank_main; rank_main(json.loads(sys.argv[2]))")
OnMessage = Callable[[int, Dict[str, Any], List["subprocess.Popen[bytes]"]], None]


class CollectiveError(RuntimeError):
    """The all-reduce did not complete: a rank died, hung, or computed a wrong sum."""


# ------------------------------------------------------------------ one rank


def _say(message: Dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def rank_main(config: Dict[str, Any]) -> None:
    """One rank: join the group, check a sum, time all-reduces of each size."""
    import torch
    import torch.distributed as dist

    rank, world = int(config["rank"]), int(config["world"])
    timeout = timedelta(seconds=float(config["timeout_s"]))
    dev = torch.device("cpu")
    if config["device"] == "cuda":
        torch.cuda.set_device(int(config["card"]))
        dev = torch.device("cuda", int(config["card"]))
    store = dist.TCPStore(  # type: ignore[attr-defined]
        config["host"], int(config["port"]), None, False, timeout=timeout)
    dist.init_process_group(config["backend"], store=store, rank=rank, world_size=world,
                            timeout=timeout)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    probe = torch.full((1024,), float(rank + 1), device=dev)
    dist.all_reduce(probe)
    want = world * (world + 1) / 2
    _say({"event": "ready", "sum_ok": bool((probe == want).all()), "sum": float(probe[0]),
          "expected": want})
    groups = {tuple(pair): dist.new_group(list(pair)) for rnd in config["rounds"]
              for pair in rnd}  # every rank creates every group, in the same order
    for size in config["sizes"]:
        seconds = _timed(dist, torch, dev, sync, int(size), config, None)
        _say({"event": "measured", "size": int(size), "seconds": seconds})
    for number, rnd in enumerate(config["rounds"]):
        mine = [tuple(p) for p in rnd if rank in p]
        if mine:
            seconds = _timed(dist, torch, dev, sync, int(config["sizes"][-1]), config,
                             groups[mine[0]])
            _say({"event": "pair", "round": number, "pair": list(mine[0]),
                  "seconds": seconds})
        dist.barrier()  # the pairs of one round run together, rounds one after the other
    dist.destroy_process_group()
    _say({"event": "done"})


def _timed(dist: Any, torch: Any, dev: Any, sync: Callable[[], Any], size: int,
           config: Dict[str, Any], group: Any) -> float:
    """Seconds per all-reduce of ``size`` bytes (float32) over ``group`` (None: all)."""
    buf = torch.zeros(size // 4, dtype=torch.float32, device=dev)
    for _ in range(int(config["warmup"])):
        dist.all_reduce(buf, group=group)
    sync()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    for _ in range(int(config["iters"])):
        dist.all_reduce(buf, group=group)
    sync()
    return (time.perf_counter() - t0) / int(config["iters"])


# ------------------------------------------------------------------ the parent


class _Rank:
    def __init__(self, rank: int, card: Optional[int], proc: subprocess.Popen[bytes]) -> None:
        self.rank, self.card, self.proc = rank, card, proc
        self.stderr: List[str] = []
        self.done = False
        self.eof = 0  # stdout and stderr both closed: 2

    @property
    def label(self) -> str:
        return f"rank {self.rank} (card {self.card})" if self.card is not None \
            else f"rank {self.rank}"


def run_allreduce(world: int, *, backend: str = "gloo", device: str = "cpu",
                  cards: Optional[Sequence[int]] = None, sizes: Sequence[int] = (1 << 20,),
                  iters: int = 5, warmup: int = 2, timeout_s: float = 60.0,
                  rounds: Sequence[Sequence[Tuple[int, int]]] = (),
                  on_message: Optional[OnMessage] = None) -> Dict[str, Any]:
    """All-reduce over ``world`` ranks; per size the slowest rank's seconds and the busbw.

    ``cards[i]`` is the card of rank i on CUDA. ``rounds`` are rounds of disjoint rank
    pairs (runner.cards.pair_rounds), each pair timed at the largest size after the full
    all-reduce, in the same processes. ``on_message(rank, message, procs)`` sees
    every message a rank sends (tests use it to kill a rank mid-way).
    """
    import torch.distributed as dist

    store = dist.TCPStore(  # type: ignore[attr-defined]
        "127.0.0.1", 0, None, True, timeout=timedelta(seconds=timeout_s),
        wait_for_workers=False)
    inbox: queue.Queue[Tuple[int, str, Optional[str]]] = queue.Queue()
    ranks: List[_Rank] = []
    path = [os.path.abspath(p) if p else os.getcwd() for p in sys.path]
    t0 = time.monotonic()
    try:
        for rank in range(world):
            card = cards[rank] if cards is not None else None
            config = {"rank": rank, "world": world, "host": "127.0.0.1", "port": store.port,
                      "backend": backend, "device": device, "card": card,
                      "sizes": list(sizes), "iters": iters, "warmup": warmup,
                      "rounds": [[list(p) for p in rnd] for rnd in rounds],
                      # a rank's own timeout comes after the parent's deadline: the
                      # parent names the silent ranks (a rank timing out first ended
                      # with a signal of its own under load, naming nobody)
                      "timeout_s": timeout_s + 30}
            proc = subprocess.Popen(
                [sys.executable, "-c", _BOOT, json.dumps(path), json.dumps(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            ranks.append(_Rank(rank, card, proc))
            for stream, name in ((proc.stdout, "out"), (proc.stderr, "err")):
                threading.Thread(target=_pump, args=(rank, name, stream, inbox),
                                 daemon=True).start()
        timings = _collect(ranks, inbox, t0 + timeout_s, timeout_s, on_message)
    finally:
        for r in ranks:
            if r.proc.poll() is None:
                r.proc.kill()
            r.proc.wait()
        del store
    return _summary(world, timings, cards, time.monotonic() - t0)


def _pump(rank: int, name: str, stream: Any, inbox: queue.Queue[Tuple[int, str,
                                                                        Optional[str]]]) -> None:
    for raw in iter(stream.readline, b""):
        inbox.put((rank, name, raw.decode("utf-8", "replace").rstrip("\n")))
    stream.close()
    inbox.put((rank, name, None))


def _collect(ranks: List[_Rank], inbox: queue.Queue[Tuple[int, str, Optional[str]]],
             deadline: float, timeout_s: float,
             on_message: Optional[OnMessage]) -> Dict[str, Any]:
    timings: Dict[int, Dict[int, float]] = {}
    pairs: Dict[Tuple[int, int], float] = {}
    checks: List[Dict[str, Any]] = []
    while not all(r.eof == 2 for r in ranks):
        try:
            rank, stream, line = inbox.get(timeout=max(0.0, deadline - time.monotonic()))
        except queue.Empty:
            silent = [r.label for r in ranks if not r.done]
            raise CollectiveError(f"the all-reduce did not finish within {timeout_s:g} s: no "
                                  f"answer from {', '.join(silent)}") from None
        r = ranks[rank]
        if line is None:
            r.eof += 1
            if r.eof == 2:
                _check_exit(r, deadline)
            continue
        if stream == "err":
            r.stderr = (r.stderr + [line])[-20:]
            continue
        message = _parse(line)
        if message is None:
            continue
        if message.get("event") == "ready":
            checks.append(message)
        elif message.get("event") == "measured":
            size = int(message["size"])
            timings.setdefault(size, {})[rank] = float(message["seconds"])
        elif message.get("event") == "pair":
            pair = (int(message["pair"][0]), int(message["pair"][1]))
            pairs[pair] = max(pairs.get(pair, 0.0), float(message["seconds"]))
        elif message.get("event") == "done":
            r.done = True
        if on_message is not None:
            on_message(rank, message, [x.proc for x in ranks])
    wrong = [c for c in checks if not c.get("sum_ok")]
    if wrong:
        raise CollectiveError(f"the all-reduce computed a wrong sum: {wrong[0]['sum']} "
                              f"instead of {wrong[0]['expected']}")
    return {"timings": timings, "pairs": pairs}


def _check_exit(r: _Rank, deadline: float) -> None:
    try:
        code = r.proc.wait(max(1.0, deadline - time.monotonic()))
    except subprocess.TimeoutExpired:
        raise CollectiveError(f"{r.label} closed its output but did not exit") from None
    if code == 0 and r.done:
        return
    how = f"signal {-code}" if code < 0 else f"exit code {code}"
    tail = " | ".join(line for line in r.stderr[-3:] if line.strip())
    raise CollectiveError(f"{r.label} ended with {how} before the all-reduce finished"
                          + (f": {tail}" if tail else ""))


def _parse(line: str) -> Optional[Dict[str, Any]]:
    try:
        message = json.loads(line)
    except ValueError:
        return None  # a library printing on stdout: not ours
    return message if isinstance(message, dict) else None


def _summary(world: int, collected: Dict[str, Any], cards: Optional[Sequence[int]],
             seconds: float) -> Dict[str, Any]:
    """Per size and per pair (by card, not rank): the slowest rank's time and the busbw."""
    rows = []
    for size, per_rank in sorted(collected["timings"].items()):
        slowest = max(per_rank.values())
        rows.append({"size_bytes": size, "seconds": slowest,
                     "algbw_gbps": round(size / slowest / 1e9, 4),
                     "busbw_gbps": round(busbw(size, slowest, world), 4)})
    card_of = list(cards) if cards is not None else list(range(world))
    pairs = {}
    for (a, b), slowest in sorted(collected["pairs"].items()):
        pairs[f"{card_of[a]}-{card_of[b]}"] = round(busbw(rows[-1]["size_bytes"], slowest, 2), 4)
    return {"ranks": world, "sizes": rows,
            "busbw_gbps": rows[-1]["busbw_gbps"] if rows else None,
            "pairs_gbps": pairs, "wall_seconds": round(seconds, 3)}


__all__ = ["CollectiveError", "run_allreduce", "rank_main"]
