"""The volume's processing from its calibration: every phase, each with its formula.

The calibration (bot/pilot/calibration.py) ran batches of the volume's own size on a random
sample of its inputs, on the workers the volume starts on the pilot's node, each worker's
warm-up call timed apart, and recorded the results as the driver does. So:

- **warm-up**: each worker's first call costs more than a steady batch; the workers warm up
  together, so the volume pays the largest extra once: ``max(warm-up call − batch time ×
  its items ÷ batch size)``;
- **items**: ``batches = items ÷ batch size``; the batch time ``t`` is the calibration's mean
  (or, when the batches' bytes differ and time follows them, ``a + b × bytes`` at the
  volume's mean batch bytes); ``batches × t ÷ workers`` plus half a batch for the last
  round, whose workers idle in turn;
- **the range** comes from the batch-to-batch spread: ``sd`` of the calibration's batch
  times (the residuals' with the size fit), never under 5 % of ``t``; the uncertainty of
  the total is ``batches × sd × √(1 ÷ measured + 1 ÷ batches) ÷ workers`` (the calibration's
  mean over that many batches, plus the volume's own variation), times Student's t at 95 %
  for (batches measured − 1) degrees of freedom: a 90 % range;
- **the driver's recording** (one process writes the ledger, the events and any JSON
  output): ``items × recording seconds per item`` measured on the node; the processing is
  never faster than that (the larger of the two, low, middle and high alike);
- **rework**: batches that failed in the calibration are split until the failing input is
  alone: about two batch times each, ``failure rate × batches × 2 × t ÷ workers``.

Pure; ``bot/pilot/forecast.py`` calls it when the pilot has a usable calibration.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any

from bot.pilot.calibration import Calibration
from bot.pilot.forecast_stats import (
    MIN_CV,
    MIN_SAMPLES,
    duration,
    plural,
    secs,
    t95,
)

MIN_BATCHES = 3            # calibrated batches the model needs (the runner runs at least 5)
MIN_R2 = 0.5
REWORK_BATCHES = 2.0       # a failed batch costs about this many batch times (its splits)


@dataclass(frozen=True)
class Phase:
    key: str
    label: str
    value: str
    formula: str


@dataclass(frozen=True)
class Processing:
    low: float
    mid: float
    high: float
    phases: tuple[Phase, ...]
    numbers: dict[str, Any]
    notes: tuple[str, ...] = ()


def usable(cal: Calibration | None) -> bool:
    return cal is not None and cal.skipped is None and len(cal.batches) >= MIN_BATCHES \
        and cal.batch_size > 0


def batch_time(cal: Calibration, mean_bytes: float | None
               ) -> tuple[float, float, str, dict[str, Any]]:
    """(batch time, its sd, how, numbers): the mean and sd of the calibrated batches, or
    the size fit at the volume's mean batch bytes when it holds."""
    times = [b.seconds for b in cal.batches]
    mean = statistics.fmean(times)
    sd = statistics.stdev(times) if len(times) > 1 else 0.0
    how = (f"mean of {plural(len(times), 'calibrated batch', 'calibrated batches')} of "
           f"{cal.batch_size}: {secs(mean)}, sd {secs(sd)}")
    numbers: dict[str, Any] = {"batch_mean_s": round(mean, 6), "batch_sd_s": round(sd, 6)}
    fit = _fit([(float(b.bytes), b.seconds) for b in cal.batches])
    if fit is not None and mean_bytes:
        a, b, r2 = fit
        numbers["batch_fit"] = {"intercept_s": a, "slope_s_per_byte": b, "r2": round(r2, 4)}
        line = f"batch time = {secs(a)} + {b * 1e6:.4g} s/MB × batch bytes, R² = {r2:.2f}"
        if r2 >= MIN_R2 and b > 0:
            at = max(0.0, a + b * mean_bytes)
            resid = [t - (a + b * x) for x, t in ((float(c.bytes), c.seconds)
                                                  for c in cal.batches)]
            sd = math.sqrt(sum(r * r for r in resid) / max(1, len(resid) - 2))
            how = (f"{line}, at the volume's mean batch of {mean_bytes:,.0f} B: {secs(at)}; "
                   f"sd of the residuals {secs(sd)}")
            mean = at
        else:
            how += f" ({line}: not used, time does not follow size)"
    floor = MIN_CV * mean
    if sd < floor:
        sd = floor
        how += f"; sd at least {MIN_CV:.0%} of the batch time"
    numbers.update(batch_s=round(mean, 6), batch_spread_s=round(sd, 6))
    return mean, sd, how, numbers


def processing(cal: Calibration, count: int, workers: int, mean_size: float | None
               ) -> Processing:
    """The volume's processing (the work stage after Ray's start) from the calibration."""
    size = cal.batch_size
    t, sd, how, numbers = batch_time(cal, mean_size * size if mean_size else None)
    phases: list[Phase] = [Phase("batch", "Batch time (calibrated)", secs(t), how)]
    notes: list[str] = []
    m = len(cal.batches)
    batches = count / size
    z = t95(m - 1)
    compute = batches * t / workers + (0.5 * t if batches > workers else 0.0)
    spread = batches * sd * math.sqrt(1 / m + 1 / max(batches, 1)) / workers
    phases.append(Phase("items", "Items on the workers",
                        f"{duration(max(0.0, compute - z * spread))} – "
                        f"{duration(compute + z * spread + t)}",
                        f"{count:,} items ÷ {size} = {batches:,.1f} batches × {secs(t)} ÷ "
                        f"{plural(workers, 'worker')}"
                        + (" + half a batch for the last round" if batches > workers else "")
                        + f" = {duration(compute)}; ± {z:.3g} (Student's t, {m - 1} df) × "
                        f"{secs(spread)} ({secs(sd)} batch-to-batch × √(1 ÷ {m} measured + "
                        f"1 ÷ {batches:,.0f}) × {batches:,.0f} ÷ {workers}); + one batch "
                        "on the high side"))
    warm, warm_formula = _warm_up(cal, t)
    phases.append(Phase("warmup", "Warm-up (per worker, at once)", secs(warm), warm_formula))
    rec_low, rec_mid, rec_high, rec_formula = _recording(cal, count)
    phases.append(Phase("recording", "Driver's recording", duration(rec_mid), rec_formula))
    bound = rec_mid > compute
    if bound:
        notes.append(f"the driver's recording ({duration(rec_mid)} for {count:,} items, "
                     f"measured on the pilot's node) is slower than the workers "
                     f"({duration(compute)}): more workers would not make the volume faster")
    rework, rework_formula = _rework(cal, batches, t, workers)
    if rework_formula:
        phases.append(Phase("rework", "Rework of failing inputs", secs(rework),
                            rework_formula))
    low = warm + max(max(0.0, compute - z * spread), rec_low) + rework
    mid = warm + max(compute, rec_mid) + rework
    high = warm + max(compute + z * spread + t, rec_high) + rework
    numbers.update(calibrated_batches=m, batches=round(batches, 3), z=z,
                   compute_s=round(compute, 3), compute_sd_s=round(spread, 3),
                   warmup_s=round(warm, 3), recording_s=round(rec_mid, 3),
                   recording_bound=bound, rework_s=round(rework, 3))
    return Processing(low, mid, high, tuple(phases), numbers, tuple(notes))


def _warm_up(cal: Calibration, t: float) -> tuple[float, str]:
    if not cal.warmup:
        return 0.0, "no warm-up call measured"
    extras = [max(0.0, w.seconds - t * w.items / cal.batch_size) for w in cal.warmup]
    worst = max(extras)
    calls = ", ".join(secs(w.seconds) for w in cal.warmup)
    return worst, (f"each worker's first call, timed apart ({calls}), minus a steady batch "
                   f"of its size: the largest extra {secs(worst)}, paid once (the workers "
                   "warm up together)")


def _recording(cal: Calibration, count: int) -> tuple[float, float, float, str]:
    items = sum(r.items for r in cal.record)
    seconds = sum(r.seconds for r in cal.record)
    if not items:
        return 0.0, 0.0, 0.0, "not measured"
    per = seconds / items
    rates = [r.seconds / r.items for r in cal.record]
    sd = statistics.stdev(rates) if len(rates) > 1 else per
    band = t95(len(rates) - 1) * sd / math.sqrt(len(rates)) if len(rates) > 1 else per
    mid = count * per
    low, high = count * max(0.0, per - band), count * (per + band)
    return low, mid, high, (f"{count:,} items × {per * 1000:.3g} ms per item (the "
                            f"calibration's {items:,} results recorded into a scratch ledger "
                            f"and events file on the pilot's node in {secs(seconds)}); the "
                            "processing is never faster than the driver records")


def _rework(cal: Calibration, batches: float, t: float, workers: int) -> tuple[float, str]:
    runs = len(cal.batches) + cal.failed_batches + len(cal.warmup)
    if not cal.failed_batches or not runs:
        return 0.0, ""
    rate = cal.failed_batches / runs
    seconds = rate * batches * REWORK_BATCHES * t / workers
    return seconds, (f"{cal.failed_batches} of {runs} calibration calls failed: {rate:.1%} "
                     f"× {batches:,.0f} batches × {REWORK_BATCHES:g} batch times (the "
                     f"splits until the failing input is alone) × {secs(t)} ÷ {workers}")


def _fit(points: list[tuple[float, float]]) -> tuple[float, float, float] | None:
    """Least squares ``time = a + b × bytes`` and its R² (random batches of the same size
    differ little in bytes, but a time that follows them still shows in R²)."""
    if len(points) < MIN_SAMPLES:
        return None
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    if sxx <= 0:
        return None
    b = sum((x - mx) * (y - my) for x, y in points) / sxx
    a = my - b * mx
    ss_res = sum((y - (a + b * x)) ** 2 for x, y in points)
    return a, b, (1.0 - ss_res / syy if syy > 0 else 0.0)
