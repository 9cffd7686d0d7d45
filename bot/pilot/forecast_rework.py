"""The rework the pilot's refusals predict for the volume: what an input that fails costs
beyond its own time. Pure; docs/forecast.md ("Rework").

How the volume treats a refusal decides its cost (runner/volume_queue.py):

- a refusal the handler **returns** (``status: refused``) costs nothing more: the input ran
  in its batch like any other, and its time is inside the measured batches;
- an input that **hangs** (interrupted at the item timeout: the pilot's ``timed_out``) costs
  its batch's wait until the item clock fires (about one item timeout: the other inputs
  have a margin over the pilot's pace), then the batch again one input a call (about one
  batch time), the hanging one alone until its own timeout: ``2 × item timeout + a batch``;
- an input whose handler **raises** fails its batch, which is split until the input is
  alone (the calibration's failed calls: ``bot/pilot/forecast_model.py``'s rework). A
  passing pilot had none (a raise fails the pilot).

The pilot's hang rate applies to the volume's items: ``items × timed out ÷ pilot items``
inputs, each ``2 × item timeout + batch time``, shared by the workers.
"""

from __future__ import annotations

from dataclasses import dataclass

from bot.pilot.forecast_stats import duration, plural, secs

HANG_TIMEOUTS = 2.0        # item timeouts an input that hangs costs (its batch's, its own)


@dataclass(frozen=True)
class Rework:
    seconds: float
    value: str
    formula: str


def hang_rework(count: int, pilot_items: int, timed_out: int, refused: int,
                item_timeout_s: float, batch_s: float, workers: int) -> Rework | None:
    """The rework of the volume's inputs that hang, from the pilot's rate; None when the
    pilot refused nothing (no figure to show)."""
    if pilot_items < 1 or (timed_out < 1 and refused < 1):
        return None
    returned = refused - timed_out
    said = (f"{plural(max(0, returned), 'refusal')} the handler returned: no rework (their "
            "time is in the measured batches)")
    if timed_out < 1:
        return Rework(0.0, "0 s", f"the pilot's {refused} of {pilot_items} refused: {said}")
    rate = timed_out / pilot_items
    hung = rate * count
    each = HANG_TIMEOUTS * item_timeout_s + batch_s
    seconds = hung * each / max(1, workers)
    return Rework(seconds, duration(seconds) if seconds >= 60 else secs(seconds),
                  f"{timed_out} of the pilot's {pilot_items} inputs hung (interrupted at the "
                  f"item timeout): {rate:.1%} × {count:,} items = {hung:,.1f} inputs × "
                  f"({HANG_TIMEOUTS:g} × {secs(item_timeout_s)} item timeout + "
                  f"{secs(batch_s)} batch, run again one input a call) ÷ "
                  f"{plural(workers, 'worker')}; " + said)
