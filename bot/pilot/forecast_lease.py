"""The forecast against the lease: the finish, the lease's end and margin, the share and
worth of the rented card-hours, the memory peak against the card. Pure, money in Decimal."""

from __future__ import annotations

from datetime import timedelta
from decimal import ROUND_HALF_UP, Decimal
from typing import Any

from bot.pilot.forecast_stats import duration, hours, percent, plural, stamp
from bot.pilot.forecast_types import Figure, ForecastInputs

LOW_SHARE = 0.05           # under this share of the rented card-hours: maybe rented too much
MEMORY_TIGHT = 0.9         # peak over this fraction of the card's memory: say so
CENT = Decimal("0.01")


def lease_fit(inp: ForecastInputs, low_s: float, high_s: float, figures: list[Figure],
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


def card_hours(inp: ForecastInputs, low_s: float, high_s: float, cards_used: int,
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


def memory(inp: ForecastInputs, figures: list[Figure], notes: list[str]) -> None:
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
