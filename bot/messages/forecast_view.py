"""The forecast message of a thread: before approval, the volume's forecast with each
figure's formula; after the volume, its actual wall time beside the forecast."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from bot.messages.model import Fields, Heading, Message, Table, Text
from bot.pilot.forecast import duration
from bot.pilot.payloads import StoredForecast
from bot.pilot.record import Run
from bot.pilot.volume_limits import VolumeLimits, volume_limits


def forecast_message(run: Run) -> Message | None:
    fc = run.forecast
    if fc is None:
        return None
    if fc.is_check:
        return _check_message(run, fc)
    limits = _limits(run, fc)
    if not fc.possible:
        return Message(run.id, "forecast",
                       (Heading("Forecast of the volume"),
                        Text(f"No forecast: {fc.reason}", style="warn"),
                        *_limit_lines(limits)),
                       summary=f"{run.name}: no forecast of the volume")
    rows = tuple((f.label, f.value, f.formula) for f in fc.figures) + \
        (limits.rows() if limits else ())
    verdict = fit_line(fc)
    blocks: list[Any] = [Heading("Forecast of the volume"),
                         Text(verdict, style="ok" if fc.fits else
                              "error" if fc.fits is False else "plain"),
                         Table(("figure", "value", "formula"), rows)]
    for note in [*fc.notes, *(limits.notes if limits else ())]:
        blocks.append(Text(note, style="warn"))
    return Message(run.id, "forecast", tuple(blocks), summary=f"{run.name}: {verdict}")


def _limits(run: Run, fc: StoredForecast) -> VolumeLimits | None:
    """The volume's time limit and batch timeout as an approval now would set them."""
    return volume_limits(run.manifest_json, run.plan.to_dict() if run.plan else {},
                         fc.as_dict(),
                         datetime.now(timezone.utc))


def _limit_lines(limits: VolumeLimits | None) -> tuple[Text, ...]:
    if limits is None:
        return ()
    return (*(Text(f"{label}: {value} ({why})", style="plain")
              for label, value, why in limits.rows()),
            *(Text(note, style="warn") for note in limits.notes))


def fit_line(forecast: StoredForecast) -> str:
    """One sentence: does the high estimate end before the lease does? The figure is the
    wall time, and says so (its setup and processing apart): the one scored after the
    volume is its work stage alone (``check_rows``)."""
    fc = forecast.values
    wall = f"{duration(float(fc['low_s']))} – {duration(float(fc['high_s']))} of wall time"
    if isinstance(fc.get("setup_s"), (int, float)) and "proc_low_s" in fc:
        wall += (f" (setup {duration(float(fc['setup_s']))} + processing "
                 f"{duration(float(fc['proc_low_s']))} – {duration(float(fc['proc_high_s']))})")
    if forecast.fits is None:
        return f"The volume takes {wall}; the lease's end is unknown (no lease.starts_at)"
    margin = duration(abs(float(fc.get("margin_s") or 0)))
    if forecast.fits:
        return f"The volume takes {wall} and fits in the lease with {margin} to spare"
    return (f"The volume takes {wall}: the high estimate ends {margin} AFTER the lease "
            "ends; approving needs an override reason")


def check_rows(check: StoredForecast) -> list[tuple[str, str]]:
    """The volume's actual time beside its forecast, each labelled with what it spans: the
    work stage (Ray's start and the items), not the wall time shown before approval,
    which adds the setup and is shown beside them, not scored."""
    fc = check.values
    actual, low, high = (float(fc[k]) for k in ("actual_s", "forecast_low_s", "forecast_high_s"))
    mid = float(fc.get("forecast_mid_s") or low)
    error = fc.get("error_pct")
    attempts = int(fc.get("attempts") or 1)
    done, total = fc.get("items_done"), fc.get("items_total")
    scope = (f"{done:,} of {total:,} items (the forecast scaled to them)"
             if fc.get("scored") == "partial" and done is not None and total else
             "the whole volume")
    rows = [("Actual time of the work stage (Ray start + processing)",
             duration(actual) + (f" over {attempts} attempts" if attempts > 1 else "")),
            ("Scored on", scope),
            ("Forecast of the work stage", f"{duration(mid)} ({duration(low)} – "
                                           f"{duration(high)}), the same span: no setup"),
            ("Error against the middle", "—" if error is None else f"{error:+.1f}%"),
            ("Within the range", "yes" if fc.get("within_range") else "no")]
    if isinstance(fc.get("wall_low_s"), (int, float)) and \
            isinstance(fc.get("wall_high_s"), (int, float)):
        rows.append(("Wall time forecast before approval",
                     f"{duration(float(fc['wall_low_s']))} – "
                     f"{duration(float(fc['wall_high_s']))} (setup included: copies, "
                     "diagnostics, Ray; not scored)"))
    return rows


def _check_message(run: Run, check: StoredForecast) -> Message:
    fc = check.values
    actual, low, high = (float(fc[k]) for k in ("actual_s", "forecast_low_s", "forecast_high_s"))
    pairs: tuple[tuple[str, str], ...] = tuple(check_rows(check))
    if fc.get("workers_started") is not None:
        pairs += (("Workers", f"{fc['workers_started']} started (the last attempt), "
                              f"{fc.get('workers_forecast')} forecast"),)
    pairs += (("Formula", str(fc.get("formula") or "")),)
    return Message(run.id, "forecast", (Heading("Forecast against the actual"), Fields(pairs)),
                   summary=f"{run.name}: took {duration(actual)}, forecast "
                           f"{duration(low)} – {duration(high)}")


def proven_message(run: Run) -> Message | None:
    """A volume's forecast made again on its proven nodes (``bot.service.proven``): one line
    in the thread, when it differs from the approved one; None otherwise."""
    proven = run.forecast.proven if run.forecast is not None else {}
    if not proven.get("differs") or not proven.get("line"):
        return None
    line = str(proven["line"])
    return Message(run.id, "forecast_proven", (Text(line, style="warn"),),
                   summary=f"{run.name}: {line}")
