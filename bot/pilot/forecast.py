"""The volume's forecast from the pilot's measurements: time, finish, lease fit, card-hours.

A pure function: ``forecast(ForecastInputs) -> Forecast``, no I/O, money in Decimal. Every
figure carries the formula that produced it, so a reader can check it by hand. Where the
pilot cannot support a figure (no per-item times, fewer than ``MIN_SAMPLES`` accepted
items), the forecast says so instead of inventing a number. docs/forecast.md explains each
figure and how to read the range.

The phases, one module each: the setup (``forecast_setup``), the processing from the
calibration (``forecast_model``) or from the pilot alone (``forecast_pilot``), what comes
after the items (``forecast_after``), and the lease fit (``forecast_lease``); the records
are ``forecast_types``, the statistics and wording ``forecast_stats``.
"""

from __future__ import annotations

from typing import Any

from bot.pilot import forecast_model, forecast_pilot
from bot.pilot.calibration import Calibration
from bot.pilot.forecast_after import after_items
from bot.pilot.forecast_lease import card_cost, card_hours, lease_fit, memory
from bot.pilot.forecast_rework import hang_rework
from bot.pilot.forecast_setup import (
    RAY_HIGH,
    RAY_LOW,
    RAY_START_AT_ONCE,
    RAY_START_S,
    ray_start,
    setup,
)
from bot.pilot.forecast_stats import (
    ASSUMED_CV,
    MIN_SAMPLES,
    Sample,
    duration,
    item_spread,
    plural,
    quantile,
    secs,
    size_fit,
    t95,
)
from bot.pilot.forecast_stats import ItemOutcome as ItemOutcome  # re-exported
from bot.pilot.forecast_types import Figure, Forecast, ForecastInputs, Setup
from bot.pilot.forecast_workers import proven_cards as proven_cards  # re-exported
from bot.pilot.forecast_workers import volume_workers
from bot.pilot.volume_limits import item_timeout_for


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
    spread = forecast_pilot.per_item(inp, figures, notes, numbers) \
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
        forecast_pilot.rests_on_pilot(inp, notes, numbers)
        proc = forecast_pilot.processing(inp, spread, workers, figures, notes, numbers)
    proc = _hang_rework(inp, proc, workers, figures, numbers)
    setup_s = setup(inp, figures, numbers)
    after = after_items(inp, figures, numbers)
    # Ray's start is measured once: the range takes it from RAY_LOW to RAY_HIGH times that
    ray = float(numbers["setup_ray_s"])
    low_s = setup_s - ray + RAY_LOW * ray + proc[0] + after
    mid_s = setup_s + proc[1] + after
    high_s = setup_s - ray + RAY_HIGH * ray + proc[2] + after
    figures.append(Figure("wall", "Wall time of the volume",
                          f"{duration(low_s)} – {duration(high_s)}",
                          f"setup {duration(setup_s)} (its Ray start × {RAY_LOW:g} – "
                          f"{RAY_HIGH:g}: measured once) + processing {duration(proc[0])} – "
                          f"{duration(proc[2])} + after the items (collection, evidence, fetch) "
                          f"{duration(after)} = "
                          f"{duration(low_s)} – {duration(high_s)} "
                          f"(middle {duration(mid_s)})"))
    numbers.update(low_s=round(low_s, 3), mid_s=round(mid_s, 3), high_s=round(high_s, 3))
    fits = lease_fit(inp, low_s, high_s, figures, notes, numbers)
    card_hours(inp, low_s, high_s, cards_used, figures, notes, numbers)
    memory(inp, figures, notes)
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
        f"{cal.listed:,}"
        + (f" on {cal.drawn_on} and sent with the pilot ({plural(cal.sample_sent, 'input')}: "
           "the node does not hold the corpus)" if cal.drawn_on else "")
        + f", on {plural(cal.workers, 'worker')} of the pilot's node; "
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


def _hang_rework(inp: ForecastInputs, proc: tuple[float, float, float], workers: int,
                 figures: list[Figure], numbers: dict[str, Any]
                 ) -> tuple[float, float, float]:
    """The processing plus the rework of the inputs that hang at the pilot's rate
    (``bot/pilot/forecast_rework.py``), its figure beside the processing's."""
    batch_s = float(numbers.get("batch_s") or
                    max(1, inp.batch_size) * float(numbers.get("item_mean_s") or
                                                   numbers.get("mean_s") or 0.0))
    timeout, why = item_timeout_for(inp.item_timeout_s, float(numbers.get("p90_s") or 0.0))
    rework = hang_rework(inp.volume_count, inp.pilot_items, inp.pilot_timed_out,
                         inp.pilot_refused, timeout, batch_s, workers)
    if rework is None:
        return proc
    at = next(k for k, f in enumerate(figures) if f.key == "processing")
    figures.insert(at, Figure("rework_hangs", "Rework of inputs that hang", rework.value,
                              rework.formula + f" (item timeout: {why})"))
    if rework.seconds <= 0:
        return proc
    low, mid, high = (p + rework.seconds for p in proc)
    shown = figures[at + 1]
    figures[at + 1] = Figure(shown.key, shown.label, f"{duration(low)} – {duration(high)}",
                             shown.formula + f"; + the rework of inputs that hang "
                             f"{secs(rework.seconds)}")
    numbers.update(rework_hangs_s=round(rework.seconds, 3), proc_low_s=round(low, 3),
                   proc_mid_s=round(mid, 3), proc_high_s=round(high, 3))
    return low, mid, high


def _where(inp: ForecastInputs) -> str:
    return f" ({inp.volume_where})" if inp.volume_where else ""


__all__ = [  # the forecast and what its callers read from it (some kept in other modules)
    "ForecastInputs", "Forecast", "Figure", "Setup", "ItemOutcome", "Sample", "forecast",
    "card_cost", "proven_cards", "duration", "plural", "secs", "t95", "ray_start",
    "ASSUMED_CV", "RAY_HIGH", "RAY_LOW", "RAY_START_AT_ONCE", "RAY_START_S", "item_spread",
    "quantile", "size_fit",
]

