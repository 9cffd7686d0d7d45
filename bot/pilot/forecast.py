"""The volume's forecast from the pilot's measurements: time, finish, lease fit, card-hours.

A pure function: ``forecast(ForecastInputs) -> Forecast``, no I/O, money in Decimal. Every
figure carries the formula that produced it, so a reader can check it by hand. Where the
pilot cannot support a figure (no per-item times, fewer than ``MIN_SAMPLES`` accepted
items), the forecast says so instead of inventing a number. docs/forecast.md explains each
figure and how to read the range.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from bot.pilot import forecast_model
from bot.pilot.calibration import Calibration
from bot.pilot.forecast_stats import (
    ASSUMED_CV,
    MIN_SAMPLES,
    Sample,
    Spread,
    duration,
    fastest_unit,
    hours,
    item_spread,
    percent,
    plural,
    quantile,
    secs,
    size_fit,
    stamp,
)
from bot.pilot.forecast_stats import ItemOutcome as ItemOutcome  # re-exported
from bot.pilot.forecast_stats import t95 as t95  # re-exported
from bot.pilot.forecast_workers import proven_cards as proven_cards  # re-exported
from bot.pilot.forecast_workers import volume_workers, worker_threads

MIN_R2 = 0.5               # below this, time does not follow size well enough to use the fit
LOW_SHARE = 0.05           # under this share of the rented card-hours: maybe rented too much
MEMORY_TIGHT = 0.9         # peak over this fraction of the card's memory: say so
CENT = Decimal("0.01")
SKEW_TAIL = 1.0            # skewness above this is a heavy tail: the high end widens
RAY_START_S = 4.6          # a local Ray and its workers, per attempt (measured, embedded default)
RAY_LOW, RAY_HIGH = 0.5, 2.0  # Ray's start, measured once: two starts on a loaded machine
#                              differed 2× (4.9 and 10.9 s), so the range takes it × these
RAY_START_AT_ONCE = 8      # nodes that start Ray together (bot/dispatch/ray_cluster.py's bound)
UPLOAD_BYTES_PER_S = 50e6  # an SSH node's upload of the inputs, when not measured
HASH_BYTES_PER_S = 500e6  # a node reading and hashing its copy of the corpus (on_nodes)


@dataclass(frozen=True)
class Setup:
    """What the volume pays before its items run, as the pilot measured it (None: not
    measured). ``diagnostics_s``: the pilot's stages before its pilot stage (the volume
    runs the same); ``dispatch_s``: from the pilot's dispatch to its runner's start (upload
    and launch); ``proof_s``: the pilot's card stages (a node's card proof runs them)."""

    diagnostics_s: float | None = None
    dispatch_s: float | None = None
    proof_s: float | None = None
    ssh: bool = False
    inputs_on_nodes: bool = False  # volume.inputs.on_nodes: checked there, not uploaded


@dataclass(frozen=True)
class ForecastInputs:
    samples: tuple[Sample, ...]
    accepted: int
    volume_count: int
    rented_cards: int
    cards_per_lot: int
    lots: int
    days: int
    lot_price_usd_per_day: Decimal
    now: datetime
    task_kind: str = "classify"
    command: bool = False
    volume_bytes: int | None = None
    volume_max_bytes: int | None = None
    volume_where: str = ""
    volume_listed: bool = True         # False: the count is volume.inputs.expected_count
    healthy_cards: int | None = None   # proven on the pilot's node
    # Each node's healthy cards as its card proof at the volume's dispatch found them, in
    # volume.nodes order (0: a node dropped; None: its stages judged no card, its share
    # counts); None: the nodes are not proven yet (before approval)
    node_cards: tuple[int | None, ...] | None = None
    cards_per_worker: int = 1
    nodes: int = 1
    pilot_node: int | None = 0         # which of the volume's nodes the pilot proved; None: none
    gpus: bool = True                  # the volume's workers ask for cards (else: CPU workers)
    cores: int | None = None           # the pilot node's cores (a CPU volume's workers)
    batch_size: int = 1                # the volume's batch (its last round may idle workers)
    setup: Setup = field(default_factory=Setup)
    peak_memory_gib: float | None = None
    card_memory_gib: float | None = None
    lease_starts_at: datetime | None = None
    # The torch threads the pilot measured its items with, and why (its pilot stage's facts;
    # None: not recorded, e.g. no torch); ``torch_threads``: the manifest's task.torch_threads
    pilot_threads: int | None = None
    pilot_threads_why: str | None = None
    torch_threads: int | None = None
    # The volume's calibration on the pilot's node (bot/pilot/calibration.py); None: none
    # ran; ``calibrate``: the manifest's volume.calibrate
    calibration: Calibration | None = None
    calibrate: bool = True
    # The pilot's evidence stage: (seconds, files, bytes) and the pilot's items
    evidence: tuple[float, int, int] | None = None
    pilot_items: int = 0


@dataclass(frozen=True)
class Figure:
    key: str
    label: str
    value: str
    formula: str

    def to_dict(self) -> dict[str, str]:
        return {"key": self.key, "label": self.label, "value": self.value,
                "formula": self.formula}


@dataclass(frozen=True)
class Forecast:
    possible: bool
    reason: str | None = None
    figures: tuple[Figure, ...] = ()
    notes: tuple[str, ...] = ()
    fits: bool | None = None
    numbers: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able: seconds as numbers, money as exact decimal strings, times as ISO."""
        return {"possible": self.possible, "reason": self.reason, "fits": self.fits,
                "figures": [f.to_dict() for f in self.figures], "notes": list(self.notes),
                **self.numbers}

    def figure(self, key: str) -> Figure:
        return next(f for f in self.figures if f.key == key)


def forecast(inp: ForecastInputs) -> Forecast:
    """The forecast, or an explanation of why the pilot cannot support one."""
    refusal = _refusal(inp)
    if refusal is not None:
        return Forecast(possible=False, reason=refusal)
    figures: list[Figure] = []
    notes: list[str] = []
    numbers: dict[str, Any] = {"volume_count": inp.volume_count,
                               "volume_bytes": inp.volume_bytes}
    size = f", {inp.volume_bytes:,} B" if inp.volume_bytes is not None else ", size unknown"
    figures.append(Figure("volume", "Volume inputs", f"{inp.volume_count:,} items{size}",
                          f"listed{_where(inp) or ' from volume.inputs'}" if inp.volume_listed
                          else f"not listed: {inp.volume_where}"))
    if not inp.volume_listed:
        notes.append(f"the volume's {inp.volume_count:,} inputs are the manifest's "
                     "volume.inputs.expected_count, not a listing: their sizes are unknown "
                     "until the nodes list them")
    calibrated = forecast_model.usable(inp.calibration)
    spread = _per_item(inp, figures, notes, numbers) \
        if len(inp.samples) >= MIN_SAMPLES else None
    workers, cards_used, formula = volume_workers(inp)
    figures.append(Figure("workers", "Workers", str(workers), formula))
    numbers.update(workers=workers, cards_used=cards_used)
    if workers < 1:
        return Forecast(possible=False, reason=formula + ": no worker can run")
    if calibrated and inp.calibration is not None:
        proc = _calibrated(inp, inp.calibration, workers, figures, notes, numbers)
    else:
        assert spread is not None  # _refusal saw to it
        _uncalibrated(inp, notes, numbers)
        proc = _processing(inp, spread, workers, figures, notes, numbers)
    setup = _setup(inp, figures, numbers)
    after = _after(inp, figures, numbers)
    # Ray's start is measured once: the range takes it from RAY_LOW to RAY_HIGH times that
    ray = float(numbers["setup_ray_s"])
    low_s = setup - ray + RAY_LOW * ray + proc[0] + after
    mid_s = setup + proc[1] + after
    high_s = setup - ray + RAY_HIGH * ray + proc[2] + after
    figures.append(Figure("wall", "Wall time of the volume",
                          f"{duration(low_s)} – {duration(high_s)}",
                          f"setup {duration(setup)} (its Ray start × {RAY_LOW:g} – "
                          f"{RAY_HIGH:g}: measured once) + processing {duration(proc[0])} – "
                          f"{duration(proc[2])} + evidence {duration(after)} = "
                          f"{duration(low_s)} – {duration(high_s)} "
                          f"(middle {duration(mid_s)})"))
    numbers.update(low_s=round(low_s, 3), mid_s=round(mid_s, 3), high_s=round(high_s, 3))
    fits = _lease(inp, low_s, high_s, figures, notes, numbers)
    _card_hours(inp, low_s, high_s, cards_used, figures, notes, numbers)
    _memory(inp, figures, notes)
    return Forecast(possible=True, figures=tuple(figures), notes=tuple(notes), fits=fits,
                    numbers=numbers)


def _refusal(inp: ForecastInputs) -> str | None:
    if inp.task_kind == "train" and not inp.samples:
        return ("a training pilot records no per-item time: the volume cannot be forecast "
                "from it")
    if inp.command and not inp.samples:
        return ("the command reported no per-item time (\"elapsed_s\" in its results): "
                "no forecast rather than a guess")
    if inp.volume_count >= 1 and forecast_model.usable(inp.calibration):
        return None  # the calibration times the volume's own batches
    if not inp.samples:
        return "the pilot recorded no per-item time: no forecast rather than a guess"
    if len(inp.samples) < MIN_SAMPLES:
        return (f"only {plural(len(inp.samples), 'accepted item')} with a measured time (of "
                f"{inp.accepted} accepted): a forecast needs at least {MIN_SAMPLES}")
    if inp.volume_count < 1:
        return f"the volume lists no inputs{_where(inp)}: nothing to forecast"
    return None


def _per_item(inp: ForecastInputs, figures: list[Figure], notes: list[str],
              numbers: dict[str, Any]) -> Spread:
    """The volume's per-item time: mean and spread, at the volume's mean size when the fit
    holds (then the spread is the residuals')."""
    times = [s.seconds for s in inp.samples]
    p50, p90 = quantile(times, 0.5), quantile(times, 0.9)
    n = len(times)
    spread = item_spread(inp.samples, times)
    figures.append(Figure("per_item", "Per-item time (pilot)",
                          f"{secs(spread.mean)} mean, {secs(spread.sd)} sd",
                          f"{plural(n, 'accepted item')}' measured times: {spread.how}; "
                          f"p50 {secs(p50)}, p90 {secs(p90)}"))
    numbers.update(samples=n, p50_s=p50, p90_s=p90, mean_s=spread.mean, sd_s=spread.sd,
                   units=spread.units)
    _conditions(inp, figures, notes, numbers)
    if spread.units < 2:
        notes.append(f"the pilot timed its items as {plural(spread.units, 'batch', 'batches')}"
                     f" only: the spread between items was not measured and is assumed "
                     f"({ASSUMED_CV:.0%} of the mean); a pilot of several batches (or "
                     "task.batch_size 1) measures it")
    fit = size_fit(inp.samples)
    if fit is None:
        return spread
    a, b, r2 = fit
    numbers["fit"] = {"intercept_s": a, "slope_s_per_byte": b, "r2": round(r2, 4)}
    line = f"time = {secs(a)} + {b * 1000:.4g} ms/KB × size, R² = {r2:.2f}"
    if r2 < MIN_R2 or b <= 0 or not inp.volume_bytes:
        why = ("the volume's sizes are unknown" if not inp.volume_bytes and r2 >= MIN_R2 and b > 0
               else f"time does not follow size well enough (R² {r2:.2f} < {MIN_R2})")
        figures.append(Figure("fit", "Time against size", f"R² = {r2:.2f} (not used)",
                              f"least squares over {n} items: {line}; {why}: the pilot's "
                              "mean and spread apply"))
        return spread
    residuals = [s.seconds - (a + b * float(s.input_bytes or 0)) for s in inp.samples]
    mean_v = inp.volume_bytes / inp.volume_count
    base = max(0.0, a + b * mean_v)
    rest = item_spread(inp.samples, residuals)
    fitted = Spread(base, rest.sd, rest.items, rest.units, rest.z, rest.skew,
                    f"{line} at the volume's mean size; spread of the residuals: {rest.how}")
    figures.append(Figure("fit", "Time against size", f"R² = {r2:.2f} (used)",
                          f"least squares over {n} items: {line}; at the volume's mean "
                          f"{mean_v:,.0f} B: {secs(base)} per item, sd {secs(rest.sd)} "
                          "(the residuals')"))
    numbers.update(item_mean_s=base, item_sd_s=rest.sd)
    return fitted


def _conditions(inp: ForecastInputs, figures: list[Figure], notes: list[str],
                numbers: dict[str, Any]) -> None:
    """Under which conditions the per-item time was measured, beside those of a volume
    worker: the same torch threads, or a note saying the time may not carry over."""
    threads, why = worker_threads(inp)
    worker = f"{plural(threads, 'torch thread')} ({why})" if threads else why
    numbers.update(pilot_threads=inp.pilot_threads, worker_threads=threads)
    if inp.pilot_threads is None:
        text = f"pilot's torch threads not recorded; each volume worker: {worker}"
    else:
        text = (f"the pilot measured with {plural(inp.pilot_threads, 'torch thread')}"
                + (f" ({inp.pilot_threads_why})" if inp.pilot_threads_why else "")
                + f"; each volume worker runs with {worker}")
    figures.append(Figure("conditions", "Measured under", "the volume worker's threads"
                          if threads is not None and inp.pilot_threads == threads else
                          "other threads than a volume worker's", text))
    numbers["conditions"] = text
    if threads is not None and inp.pilot_threads is not None and inp.pilot_threads != threads:
        measured = plural(inp.pilot_threads, "torch thread")
        notes.append(f"the pilot measured its items with {measured}, each volume worker gets "
                     f"{threads}: the per-item time may not carry over (a compute-heavy "
                     "handler can be several times slower with fewer threads); a pilot run "
                     "by this version measures with a worker's threads")


def _processing(inp: ForecastInputs, sp: Spread, workers: int, figures: list[Figure],
                notes: list[str], numbers: dict[str, Any]) -> tuple[float, float, float]:
    """The items' time on the workers: middle ± z · sd_total, the high end widened by a
    heavy tail and the last round of batches."""
    count = inp.volume_count
    mid = count * sp.mean / workers
    # The total's uncertainty: the pilot's mean (items ÷ measured) and the volume's own
    # variation (a sum of `count` items), shared by the workers.
    sd_total = count * sp.sd * math.sqrt(1 / sp.items + 1 / count) / workers
    tail = max(0.0, (sp.skew or 0.0) - SKEW_TAIL)
    last_round = min(max(1, inp.batch_size), math.ceil(count / workers)) * sp.mean
    # never under every item at the fastest pace the pilot measured (a wide spread from a
    # few measurements took the low end to 0 s); one measurement shows no fastest
    fastest = min(sp.mean, fastest_unit(inp.samples))
    floor = count * fastest / workers if sp.units > 1 else 0.0
    low = max(floor, mid - sp.z * sd_total)
    high = mid + sp.z * sd_total * (1 + tail) + last_round
    items = f"{count:,} items"
    figures.append(Figure("processing", "Processing time",
                          f"{duration(low)} – {duration(high)}",
                          f"middle {items} × {secs(sp.mean)} mean ÷ "
                          f"{plural(workers, 'worker')} = {duration(mid)}; ± {sp.z:.3g} × sd "
                          f"{duration(sd_total)} ({secs(sp.sd)} × √({count:,}² ÷ {sp.items} "
                          f"measured + {count:,}) ÷ {workers})"
                          + (f", the high side × {1 + tail:.2f} (heavy tail: skewness "
                             f"{sp.skew:.2f})" if tail else "")
                          + f"; + one last batch {secs(last_round)} on the high side"
                          + (f"; the low side never under {items} at the fastest measured "
                             f"{secs(fastest)} per item ÷ {workers} = {duration(floor)}"
                             if low == floor else "")))
    if tail:
        notes.append(f"the pilot's times have a heavy tail (skewness {sp.skew:.2f}): a few "
                     "slow items weigh on the total; the high estimate is widened for it")
    numbers.update(proc_low_s=round(low, 3), proc_mid_s=round(mid, 3),
                   proc_high_s=round(high, 3), proc_sd_s=round(sd_total, 3), z=sp.z)
    return low, mid, high


def _setup(inp: ForecastInputs, figures: list[Figure], numbers: dict[str, Any]) -> float:
    """What the volume pays before its items: each part with where its figure comes from."""
    st, nodes = inp.setup, max(1, inp.nodes)
    parts: list[tuple[str, str, float, str]] = []
    if st.diagnostics_s is not None:
        parts.append(("setup_diagnostics", "Setup: diagnostics", st.diagnostics_s,
                      "the pilot's stages before its pilot stage, measured (the volume runs "
                      "the same)"))
    if st.dispatch_s is not None:
        parts.append(("setup_dispatch", "Setup: dispatch", st.dispatch_s,
                      "from the pilot's dispatch to its runner's start, measured (upload of "
                      "the runner and project, launch)"))
    if st.ssh and inp.volume_bytes and st.inputs_on_nodes:
        parts.append(("setup_upload", "Setup: inputs checked on the nodes",
                      inp.volume_bytes / HASH_BYTES_PER_S,
                      f"{inp.volume_bytes:,} B ÷ {HASH_BYTES_PER_S / 1e6:g} MB/s (estimated), "
                      "read and hashed on every node at once (volume.inputs.on_nodes: none "
                      "uploaded)"))
    elif st.ssh and inp.volume_bytes:
        upload = inp.volume_bytes / UPLOAD_BYTES_PER_S * nodes
        parts.append(("setup_upload", "Setup: inputs upload", upload,
                      f"{inp.volume_bytes:,} B ÷ {UPLOAD_BYTES_PER_S / 1e6:g} MB/s (estimated) "
                      f"× {plural(nodes, 'node')}, the bot's uplink shared by the nodes' "
                      "copies"))
    if nodes > 1:
        proof = st.proof_s if st.proof_s is not None else 0.0
        parts.append(("setup_proof", "Setup: card proofs", proof,
                      f"the pilot's card stages, measured: {secs(proof)}, on every node at once"))
    # the head first, then the other nodes RAY_START_AT_ONCE at a time
    waves = 1 + -(-(nodes - 1) // RAY_START_AT_ONCE) if nodes > 1 else 1
    per_start, where = ray_start(inp)
    ray = per_start * waves
    parts.append(("setup_ray", "Setup: Ray start and stop", ray,
                  f"{per_start:.3g} s per attempt ({where})" + (
                      f" × {waves}: the head, then the {plural(nodes - 1, 'other node')} "
                      f"{RAY_START_AT_ONCE} at a time" if nodes > 1 else "")))
    total = 0.0
    for key, label, seconds, formula in parts:
        figures.append(Figure(key, label, secs(seconds), formula))
        numbers[key + "_s"] = round(seconds, 3)
        total += seconds
    figures.append(Figure("setup", "Setup", secs(total) if total < 60 else duration(total),
                          " + ".join(secs(p[2]) for p in parts) + f" = {secs(total)}"))
    numbers.update(setup_s=round(total, 3), ray_start_s=round(per_start, 3),
                   ray_start_low_s=round(RAY_LOW * per_start, 3),
                   ray_start_high_s=round(RAY_HIGH * per_start, 3))
    return total


def ray_start(inp: ForecastInputs) -> tuple[float, str]:
    """Seconds Ray and the workers (their handler loaded) take to start, and where that
    figure comes from: the calibration measured it on the pilot's node; else the
    embedded default's constant."""
    cal = inp.calibration
    if cal is not None and cal.skipped is None and cal.workers_ready_s is not None:
        stop = cal.ray_stop_s or 0.0
        return cal.workers_ready_s + stop, (
            f"the inputs listed, Ray imported and started with "
            f"{plural(cal.workers, 'worker')}, each with the handler loaded, "
            f"{secs(cal.workers_ready_s)}, + its stop at the end "
            f"{secs(stop)}: measured on the pilot's node by the calibration")
    return RAY_START_S, "a local Ray and its workers, measured on the embedded default"


def _calibrated(inp: ForecastInputs, cal: Calibration, workers: int, figures: list[Figure],
                notes: list[str], numbers: dict[str, Any]) -> tuple[float, float, float]:
    """The processing from the calibration (bot/pilot/forecast_model.py), its phases."""
    mean_size = inp.volume_bytes / inp.volume_count if inp.volume_bytes else None
    proc = forecast_model.processing(cal, inp.volume_count, workers, mean_size)
    cost = card_cost(cal.seconds or 0.0, max(1, cal.workers * max(1, inp.cards_per_worker))
                     if inp.gpus else inp.rented_cards, inp.lot_price_usd_per_day,
                     inp.cards_per_lot)
    figures.append(Figure(
        "calibration", "Calibration (the volume's own inputs)",
        f"{plural(len(cal.batches), 'batch', 'batches')} of {cal.batch_size}, "
        f"{duration(cal.seconds or 0)}, {cost} USD",
        f"{plural(cal.sample_total, 'input')} drawn at random from the volume's "
        f"{cal.listed:,}, on {plural(cal.workers, 'worker')} of the pilot's node; "
        f"sample: {cal.ids_line()}; warm-up inputs apart: {len(cal.warmup_ids)}; "
        "recorded apart, not counted in the volume (it runs them again)"))
    for phase in proc.phases:
        figures.append(Figure(phase.key, phase.label, phase.value, phase.formula))
    figures.append(Figure("processing", "Processing time",
                          f"{duration(proc.low)} – {duration(proc.high)}",
                          f"warm-up + the larger of the items on the workers and the "
                          f"driver's recording + rework: middle {duration(proc.mid)}"))
    notes.extend(proc.notes)
    if cal.errors:
        notes.append(f"{plural(cal.failed_batches, 'calibration call')} failed on the "
                     f"volume's inputs (first: {cal.errors[0]}): the volume splits such "
                     "batches until the failing input is refused alone")
    numbers.update(proc.numbers)
    if "p90_s" not in numbers:  # the volume's item timeout reads it: the warm-up included
        calls = sorted(b.seconds for b in cal.batches)
        slowest = max([quantile(calls, 0.9), *(w.seconds for w in cal.warmup)])
        numbers["p90_s"] = round(slowest / cal.batch_size, 6)
    numbers.update(calibrated=True, calibration_s=cal.seconds, calibration_cost_usd=str(cost),
                   calibration_batches=len(cal.batches), calibration_ids=cal.sample_total,
                   proc_low_s=round(proc.low, 3), proc_mid_s=round(proc.mid, 3),
                   proc_high_s=round(proc.high, 3))
    return proc.low, proc.mid, proc.high


def _uncalibrated(inp: ForecastInputs, notes: list[str], numbers: dict[str, Any]) -> None:
    """Say why the forecast rests on the pilot alone."""
    cal = inp.calibration
    if not inp.calibrate:
        why = "volume.calibrate is false"
    elif cal is None:
        why = ("no calibration was recorded (a task.command, a render or a training pilot "
               "has none)")
    elif cal.skipped is not None:
        why = f"the calibration {cal.skipped}"
    else:
        why = (f"the calibration timed only {plural(len(cal.batches), 'batch', 'batches')} "
               f"(at least {forecast_model.MIN_BATCHES} needed)")
    notes.append(f"this forecast rests on the pilot alone ({why}): its items ran at the "
                 "pilot's batch size, their first batch carries the warm-up")
    numbers.update(calibrated=False, calibration_why=why)


def _after(inp: ForecastInputs, figures: list[Figure], numbers: dict[str, Any]) -> float:
    """The volume's evidence copy, from the pilot's own: its seconds scaled by what grows
    faster, its files or its bytes (per-file and per-byte rates of the pilot's copy)."""
    if inp.evidence is None or inp.pilot_items < 1:
        return 0.0
    seconds, files, size = inp.evidence
    cal = inp.calibration
    if cal is not None and cal.skipped is None and cal.recorded:
        files_v = files + inp.volume_count * cal.output_files / cal.recorded
        bytes_v = size + inp.volume_count * cal.output_bytes / cal.recorded
        basis = f"the calibration's {cal.output_files:,} output files for {cal.recorded:,} items"
    else:
        files_v = files * inp.volume_count / inp.pilot_items
        bytes_v = size * inp.volume_count / inp.pilot_items
        basis = f"the pilot's {inp.pilot_items:,} items"
    per_file = seconds / files if files else 0.0
    per_byte = seconds / size if size else 0.0
    total = max(files_v * per_file, bytes_v * per_byte)
    figures.append(Figure("evidence", "Evidence copy", secs(total),
                          f"the larger of {files_v:,.0f} files × {per_file * 1000:.3g} ms and "
                          f"{bytes_v:,.0f} B × {per_byte * 1e6:.3g} s/MB (the pilot's copy: "
                          f"{files:,} files, {size:,} B in {secs(seconds)}; the volume's "
                          f"scaled from {basis})"))
    numbers["evidence_s"] = round(total, 3)
    return total


def _lease(inp: ForecastInputs, low_s: float, high_s: float, figures: list[Figure],
           notes: list[str], numbers: dict[str, Any]) -> bool | None:
    start, began = inp.now, "approved now"
    if inp.lease_starts_at is not None and inp.lease_starts_at > start:
        start, began = inp.lease_starts_at, "the lease starts"
    start = start.replace(microsecond=0)  # every time to the second
    finish_low = start + timedelta(seconds=round(low_s))
    finish_high = start + timedelta(seconds=round(high_s))
    figures.append(Figure("finish", "Estimated finish",
                          f"{stamp(finish_low)} – {stamp(finish_high)}",
                          f"{stamp(start)} ({began}) + {duration(low_s)} – {duration(high_s)}"))
    numbers.update(start=start.isoformat(), finish_low=finish_low.isoformat(),
                   finish_high=finish_high.isoformat())
    if inp.lease_starts_at is None:
        notes.append("lease.starts_at is not set: the lease's end, and whether the volume "
                     "fits in it, are unknown")
        return None
    end = inp.lease_starts_at + timedelta(days=inp.days)
    margin = (end - finish_high).total_seconds()
    figures.append(Figure("lease_end", "Lease ends", stamp(end),
                          f"lease.starts_at {stamp(inp.lease_starts_at)} + "
                          f"{plural(inp.days, 'day')}"))
    sign = "" if margin >= 0 else "−"
    figures.append(Figure("margin", "Margin", f"{sign}{duration(abs(margin))}",
                          f"lease end {stamp(end)} − high finish {stamp(finish_high)}"))
    numbers.update(lease_end=end.isoformat(), margin_s=margin)
    if margin < 0:
        notes.append(f"the high estimate ends {duration(-margin)} after the lease: approving "
                     "needs an override reason")
    return margin >= 0


def _card_hours(inp: ForecastInputs, low_s: float, high_s: float, cards_used: int,
                figures: list[Figure], notes: list[str], numbers: dict[str, Any]) -> None:
    rented_h = inp.rented_cards * inp.days * 24
    used_low, used_high = low_s * cards_used / 3600, high_s * cards_used / 3600
    share_low, share_high = used_low / rented_h, used_high / rented_h
    figures.append(Figure("share", "Share of the rented card-hours",
                          f"{percent(share_low)} – {percent(share_high)}",
                          f"{hours(used_low)} – {hours(used_high)} card-h "
                          f"({plural(cards_used, 'card')} × wall time) ÷ {rented_h:,} card-h "
                          f"rented ({plural(inp.rented_cards, 'card')} × "
                          f"{plural(inp.days, 'day')} × 24 h)"))
    per_card_hour = inp.lot_price_usd_per_day / (inp.cards_per_lot * 24)
    cost_low = card_cost(low_s, cards_used, inp.lot_price_usd_per_day, inp.cards_per_lot)
    cost_high = card_cost(high_s, cards_used, inp.lot_price_usd_per_day, inp.cards_per_lot)
    figures.append(Figure("cost", "Worth of the card-hours used",
                          f"{cost_low} – {cost_high} USD",
                          f"{hours(used_low)} – {hours(used_high)} card-h × "
                          f"{per_card_hour.quantize(Decimal('0.0001'), ROUND_HALF_UP)} USD per "
                          f"card-hour ({inp.lot_price_usd_per_day} USD per lot-day ÷ "
                          f"{plural(inp.cards_per_lot, 'card')} ÷ 24 h); the lease is paid "
                          "whole either way"))
    numbers.update(share_low=round(share_low, 6), share_high=round(share_high, 6),
                   rented_card_hours=rented_h, cost_low_usd=str(cost_low),
                   cost_high_usd=str(cost_high))
    if share_high < LOW_SHARE:
        notes.append(f"the volume uses under {LOW_SHARE:.0%} of the rented card-hours "
                     f"({percent(share_high)} at the high estimate): the lease may be larger than "
                     "this job needs")


def card_cost(seconds: float, cards: int, lot_price: Decimal, cards_per_lot: int) -> Decimal:
    """What ``cards`` for ``seconds`` are worth at the lease's price, to the cent."""
    value = Decimal(repr(seconds)) * cards * lot_price / (cards_per_lot * 86400)
    return value.quantize(CENT, ROUND_HALF_UP)


def _memory(inp: ForecastInputs, figures: list[Figure], notes: list[str]) -> None:
    peak, card = inp.peak_memory_gib, inp.card_memory_gib
    if peak is not None and card:
        share = peak / card
        figures.append(Figure("memory", "Peak memory vs the card", f"{share:.0%}",
                              f"{peak:.2f} GiB measured peak ÷ {card:g} GiB per card"))
        if share > MEMORY_TIGHT:
            notes.append(f"the pilot's memory peak is {share:.0%} of the card: larger inputs "
                         "in the volume may not fit")
    pilot_max = max((s.input_bytes or 0 for s in inp.samples), default=0)
    if inp.volume_max_bytes and pilot_max and inp.volume_max_bytes > pilot_max:
        notes.append(f"the volume's largest input ({inp.volume_max_bytes:,} B) is larger than "
                     f"the pilot's largest ({pilot_max:,} B): time and memory at that size were "
                     "not measured")


def _where(inp: ForecastInputs) -> str:
    return f" ({inp.volume_where})" if inp.volume_where else ""


__all__ = [  # the forecast and what its callers read from it (some kept in forecast_stats)
    "ForecastInputs", "Forecast", "Figure", "Setup", "ItemOutcome", "Sample", "forecast",
    "card_cost", "proven_cards", "duration", "plural", "secs", "t95",
]
