"""How many workers the volume starts, the cards they hold and their threads
(runner/volume.py's and runner/threads.py's rules), as the forecast counts them, each
count with its formula."""

from __future__ import annotations

from typing import Protocol

from bot.pilot.forecast_stats import plural


class ForecastInputs(Protocol):
    """What the count reads of bot/pilot/forecast.py's ForecastInputs."""

    @property
    def rented_cards(self) -> int: ...
    @property
    def healthy_cards(self) -> int | None: ...
    @property
    def node_cards(self) -> tuple[int | None, ...] | None: ...
    @property
    def cards_per_worker(self) -> int: ...
    @property
    def nodes(self) -> int: ...
    @property
    def pilot_node(self) -> int | None: ...
    @property
    def gpus(self) -> bool: ...
    @property
    def cores(self) -> int | None: ...
    @property
    def torch_threads(self) -> int | None: ...

CPU_WORKERS_MAX = 4        # a local Ray: one CPU worker per core, at most this (runner/volume.py)


def volume_workers(inp: ForecastInputs) -> tuple[int, int, str]:
    """The workers the volume starts (runner/volume.py), the cards they hold, and how.

    Cards: each node offers its own healthy cards, a worker takes ``cards_per_worker`` of
    one node: Σ ⌊node's cards ÷ cards per worker⌋. The pilot's node offers the healthy
    cards it proved; every other node its share of the rent until its card proof (at the
    volume's dispatch) says otherwise. CPU: a local Ray starts one worker per core, at most
    ``CPU_WORKERS_MAX``; a cluster (several nodes) one per core of every node. A CPU lot is
    used whole."""
    nodes = max(1, inp.nodes)
    if not inp.gpus:
        return _cpu_workers(inp, nodes)
    cpw = max(1, inp.cards_per_worker)
    share = inp.rented_cards // nodes
    if inp.node_cards is not None:
        return _proven_workers(inp.node_cards, share, cpw, inp.rented_cards)
    proven = inp.healthy_cards if inp.pilot_node is not None else None
    others = nodes - (1 if proven is not None else 0)
    workers = (proven // cpw if proven is not None else 0) + others * (share // cpw)
    parts = []
    if proven is not None:
        which = "" if nodes == 1 else " on the pilot's node"
        parts.append(f"{plural(proven, 'card')} healthy{which} (proven by the pilot) "
                     f"→ ⌊{proven} ÷ {cpw}⌋ = {proven // cpw}")
    if others:
        unproven = ("no healthy-card count measured" if proven is None and nodes == 1 else
                    "not proven yet: each node's card proof runs at the volume's dispatch")
        parts.append(f"{plural(others, 'node')} × {share} rented "
                     f"({plural(inp.rented_cards, 'card')} ÷ {plural(nodes, 'node')}; "
                     f"{unproven}) → {others} × ⌊{share} ÷ {cpw}⌋ = {others * (share // cpw)}")
    formula = (f"{'; '.join(parts)}; {cpw} card{'s' if cpw != 1 else ''} per worker: "
               f"{plural(workers, 'worker')}")
    return workers, workers * cpw, formula


def _proven_workers(node_cards: tuple[int | None, ...], share: int, cpw: int,
                    rented: int) -> tuple[int, int, str]:
    """Every node's healthy cards as its card proof found them (the volume's dispatch):
    Σ ⌊node's cards ÷ cards per worker⌋; a node whose stages judged no card counts its
    share of the rent, a node dropped none."""
    cards = [share if c is None else max(0, c) for c in node_cards]
    workers = sum(c // cpw for c in cards)
    shown = " + ".join(f"{c}" + (" (not judged: its share)" if n is None else "")
                       for c, n in zip(cards, node_cards))
    per = " + ".join(f"⌊{c} ÷ {cpw}⌋" for c in cards) if cpw > 1 else "one per card"
    formula = (f"{plural(len(cards), 'node')} proven at the volume's dispatch: {shown} = "
               f"{sum(cards)} healthy cards of {rented} rented; {per}: "
               f"{plural(workers, 'worker')}")
    return workers, workers * cpw, formula


def proven_cards(node_cards: tuple[int | None, ...], rented: int, nodes: int) -> int:
    """The healthy cards the proven nodes offer in all (a node not judged: its share)."""
    share = rented // max(1, nodes)
    return sum(share if c is None else max(0, c) for c in node_cards)


def _cpu_workers(inp: ForecastInputs, nodes: int) -> tuple[int, int, str]:
    cores = inp.cores
    known = f"{plural(cores, 'core')} on the pilot's node" if cores else \
        "cores unknown (the pilot reported no cpu_count): 1 assumed"
    cores = cores or 1
    if nodes == 1:
        workers = min(CPU_WORKERS_MAX, cores)
        return workers, inp.rented_cards, (
            f"CPU volume on a local Ray: one worker per core, at most {CPU_WORKERS_MAX}: "
            f"min({CPU_WORKERS_MAX}, {known}) = {plural(workers, 'worker')}")
    workers = cores * nodes
    return workers, inp.rented_cards, (
        f"CPU volume on a Ray cluster: one worker per core of every node: {known} × "
        f"{plural(nodes, 'node')} (the others assumed alike) = {plural(workers, 'worker')}")


def worker_threads(inp: ForecastInputs) -> tuple[int | None, str]:
    """The torch threads each volume worker gets (runner/threads.py), and why; None when
    the pilot's node did not show its cores (a GPU worker shares them)."""
    if inp.torch_threads:
        return inp.torch_threads, "task.torch_threads"
    if not inp.gpus:
        return 1, "a CPU worker: the 1 CPU Ray gives it"
    cards = inp.healthy_cards if inp.healthy_cards is not None else \
        inp.rented_cards // max(1, inp.nodes)
    workers = max(1, cards // max(1, inp.cards_per_worker))
    if not inp.cores:
        return None, "its node's cores shared by its workers (cores not measured)"
    return max(1, inp.cores // workers), (f"{inp.cores} cores ÷ {plural(workers, 'worker')} "
                                          "on its node")
