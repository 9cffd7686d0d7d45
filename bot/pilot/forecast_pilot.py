"""The processing forecast from the pilot alone (no usable calibration): the per-item time,
its spread and size fit, the conditions it was measured under, and the items' total on the
workers. Pure; docs/forecast.md ("Reading the range", the pilot alone)."""

from __future__ import annotations

import math
from typing import Any

from bot.pilot import forecast_model
from bot.pilot.forecast_stats import (
    ASSUMED_CV,
    Spread,
    duration,
    fastest_unit,
    item_spread,
    plural,
    quantile,
    secs,
    size_fit,
)
from bot.pilot.forecast_types import Figure, ForecastInputs
from bot.pilot.forecast_workers import worker_threads

MIN_R2 = 0.5               # below this, time does not follow size well enough to use the fit
SKEW_TAIL = 1.0            # skewness above this is a heavy tail: the high end widens


def per_item(inp: ForecastInputs, figures: list[Figure], notes: list[str],
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


def processing(inp: ForecastInputs, sp: Spread, workers: int, figures: list[Figure],
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

def rests_on_pilot(inp: ForecastInputs, notes: list[str], numbers: dict[str, Any]) -> None:
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
