"""Gathers what the forecast needs from a finished pilot, and checks it after the volume.

The arithmetic is ``bot.pilot.forecast`` (pure); this module reads its inputs: the pilot's
``item.done`` events (per-item seconds and input bytes), the facts of its stages (healthy
cards, memory peak), the plan (cards, price, lease) and the volume's inputs, listed where
the bot can see them (``volume.inputs.dir`` under the project directory, on the bot host).
"""

from __future__ import annotations

from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from bot.pilot.cards import healthy_cards as run_healthy_cards
from bot.pilot.forecast import ForecastInputs, ItemOutcome, Sample, forecast
from runner.inputs import InputsError, list_dir

# Where the volume's processing time is read, in this order (the stage that ran the items).
WORK_STAGES = ("volume", "pilot")


def forecast_for(run: dict[str, Any], stages: list[dict[str, Any]],
                 items: list[ItemOutcome],
                 now: datetime | None = None) -> dict[str, Any] | None:
    """The forecast of a pilot's volume as stored with the run; None when it has no volume."""
    manifest = run.get("manifest_json") or {}
    volume = manifest.get("volume")
    if not volume:
        return None
    now = now or datetime.now(timezone.utc)
    count, total, largest, where, listing_error = _volume_inputs(run, volume)
    if listing_error:
        return {"possible": False, "reason": listing_error, "figures": [], "notes": [],
                "fits": None}
    plan = run.get("plan") or {}
    task = manifest.get("task") or {}
    hardware = manifest.get("hardware") or {}
    starts = (manifest.get("lease") or {}).get("starts_at")
    inputs = ForecastInputs(
        samples=tuple(_samples(items)),
        accepted=sum(1 for item in items if item.status == "accepted"),
        volume_count=count, volume_bytes=total, volume_max_bytes=largest, volume_where=where,
        rented_cards=int(plan.get("total_cards") or 1),
        cards_per_lot=int(plan.get("cards_per_lot") or 1), lots=int(plan.get("lots") or 1),
        days=int(plan.get("days") or hardware.get("days") or 1),
        lot_price_usd_per_day=Decimal(str(plan.get("lot_price_usd_per_day") or "0")),
        now=now, task_kind=str(task.get("kind") or "classify"), command=bool(task.get("command")),
        healthy_cards=healthy_cards(stages),
        cards_per_worker=int(volume.get("cards_per_worker") or 1),
        nodes=_node_count(volume.get("nodes")),
        peak_memory_gib=_peak_memory(stages), card_memory_gib=plan.get("memory_per_card_gib"),
        lease_starts_at=datetime.fromisoformat(starts) if starts else None)
    return forecast(inputs).to_dict()


def _samples(items: list[ItemOutcome]) -> list[Sample]:
    """The accepted items' timings (``items``: the first outcome of each id)."""
    return [Sample(float(item.elapsed_s), int(item.input_bytes)  # type: ignore[arg-type]
                   if _number(item.input_bytes) else None)
            for item in items if item.status == "accepted" and _number(item.elapsed_s)]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _volume_inputs(run: dict[str, Any], volume: dict[str, Any]
                   ) -> tuple[int, int | None, int | None, str, str | None]:
    """(count, total bytes, largest, where, error) of the volume's inputs."""
    spec = volume.get("inputs") or {}
    directory = Path(str(run.get("project_dir") or ".")) / str(spec.get("dir") or "")
    where = f"{directory.resolve()} on the bot host"
    try:
        files = list_dir(str(directory.resolve()), str(spec.get("pattern") or "*"))
    except InputsError as exc:
        node = (run.get("node") or {}).get("kind")
        if node == "ssh":
            # Listing on the node itself is not done yet: say so instead of guessing.
            count = int(spec.get("expected_count") or 0)
            return (count, None, None, f"volume.inputs.expected_count {count}; "
                    "sizes unknown (the inputs live on the node)", None)
        return 0, None, None, where, f"cannot list the volume's inputs: {exc}"
    sizes = [f.size for f in files]
    return len(files), sum(sizes), max(sizes, default=None), where, None


def healthy_cards(stages: list[dict[str, Any]]) -> int | None:
    """How many healthy cards the run proved (bot.pilot.cards), when a stage measured it."""
    cards = run_healthy_cards(stages)
    return None if cards is None else len(cards)


def _peak_memory(stages: list[dict[str, Any]]) -> float | None:
    for stage in stages:
        if stage.get("stage") == "memory":
            facts = stage.get("facts") or {}
            for key in ("peak_reserved_gib", "peak_allocated_gib"):
                if _number(facts.get(key)):
                    return float(facts[key])
    return None


def check_volume(volume_run: dict[str, Any], stages: list[dict[str, Any]],
                 pilot_forecast: dict[str, Any] | None) -> dict[str, Any] | None:
    """After the volume: its actual wall time beside the forecast, and the error in percent."""
    if not pilot_forecast or not pilot_forecast.get("possible"):
        return None
    actual = work_seconds(stages)
    if actual is None:
        return None
    low, high = float(pilot_forecast["low_s"]), float(pilot_forecast["high_s"])
    error = (actual - low) / low * 100 if low > 0 else None
    return {"actual_s": round(actual, 3), "forecast_low_s": low, "forecast_high_s": high,
            "error_pct": None if error is None else round(error, 1),
            "within_range": low <= actual <= high,
            "formula": f"({actual:.3g} s actual − {low:.3g} s p50 forecast) ÷ "
                       f"{low:.3g} s = {error:+.1f}%" if error is not None else ""}


def work_seconds(stages: list[dict[str, Any]]) -> float | None:
    """Seconds the stage that processed the items ran (``volume``, else ``pilot``)."""
    by_name = {s.get("stage"): s for s in stages}
    for name in WORK_STAGES:
        stage = by_name.get(name)
        if stage and stage.get("started_at") and stage.get("ended_at"):
            began = datetime.fromisoformat(str(stage["started_at"]).replace("Z", "+00:00"))
            ended = datetime.fromisoformat(str(stage["ended_at"]).replace("Z", "+00:00"))
            return (ended - began).total_seconds()
    return None


def _node_count(nodes: Any) -> int:
    """volume.nodes: a list of nodes, or (the older form) a count; absent: the pilot's."""
    if isinstance(nodes, list):
        return max(1, len(nodes))
    return int(nodes) if isinstance(nodes, int) and nodes > 0 else 1
