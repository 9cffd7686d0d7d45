"""Gathers what the forecast needs from a finished pilot, and checks it after the volume.

The arithmetic is ``bot.pilot.forecast`` (pure); this module reads its inputs: the pilot's
``item.done`` events (per-item seconds and input bytes, a batch's items grouped back into
one measurement), the facts and times of its stages (healthy cards, cores, memory peak, the
setup it measured), the plan (cards, price, lease) and the volume's inputs, listed where
the bot can see them (``volume.inputs.dir`` under the project directory, on the bot host).
After the volume, ``check_volume`` sets the seconds its attempts' work stage ran beside
the forecast for the items they recorded.
"""

from __future__ import annotations

import json
from datetime import datetime, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

from bot.manifest.nodes import is_remote_node, node_identity
from bot.pilot.calibration import calibration_of
from bot.pilot.cards import healthy_cards as run_healthy_cards
from bot.pilot.clock import read_time
from bot.pilot.fetch_caps import FetchCaps, with_fetch_caps
from bot.pilot.forecast import ForecastInputs, ItemOutcome, Sample, Setup, forecast, plural
from bot.pilot.record import Run, RunRecord
from runner.events import Event, list_total
from runner.inputs import InputsError, list_dir

# Where the volume's processing time is read, in this order (the stage that ran the items).
WORK_STAGES = ("volume", "pilot")


def forecast_for(run: Run, stages: list[dict[str, Any]],
                 items: list[ItemOutcome], now: datetime | None = None,
                 runner_started: str | None = None,
                 node_cards: tuple[int | None, ...] | None = None,
                 listing: tuple[int, int | None, int | None, str] | None = None,
                 caps: FetchCaps | None = None) -> dict[str, Any] | None:
    """The forecast of a pilot's volume as stored with the run; None when it has no volume.
    ``runner_started``: when the pilot's runner started (its last ``run.started``), for the
    dispatch time it measured; ``node_cards``: each volume node's healthy cards as its card
    proof found them (the forecast again at the volume's dispatch, ``bot.service.proven``);
    ``listing``: (count, bytes, largest, where) of a corpus only the nodes hold, as the head
    node listed it at that dispatch; ``caps``: the bot host's fetch ceiling, for the
    volume's fetch caps sized from its expected evidence (``bot.pilot.fetch_caps``)."""
    manifest = run.manifest
    if manifest is None or manifest.volume is None:
        return None
    # the nodes as the node helpers read them (a node's JSON, as RunRecord.node holds it)
    volume = manifest.volume.model_dump(mode="json")
    node = manifest.node.model_dump(mode="json")
    now = now or datetime.now(timezone.utc)
    count, total, largest, where, listing_error = _volume_inputs(run, volume) \
        if listing is None else (*listing, None)
    listed = listing is not None or not where.startswith(NOT_LISTED)
    if listing_error:
        return {"possible": False, "reason": listing_error, "figures": [], "notes": [],
                "fits": None}
    plan, task = run.plan, manifest.task
    batch = task.batch_size
    shared = not task.command and manifest.preparation != "blender"
    inputs = ForecastInputs(
        samples=tuple(samples(items, batch if shared else 1)),
        accepted=sum(1 for item in items if item.status == "accepted"),
        volume_count=count, volume_bytes=total, volume_max_bytes=largest, volume_where=where,
        volume_listed=listed,
        rented_cards=plan.total_cards if plan else 1,
        cards_per_lot=plan.cards_per_lot if plan else 1, lots=plan.lots if plan else 1,
        days=plan.days if plan else manifest.hardware.days,
        lot_price_usd_per_day=plan.lot_price_usd_per_day if plan else Decimal("0"),
        now=now, task_kind=task.kind, command=bool(task.command),
        healthy_cards=healthy_cards(stages), node_cards=node_cards,
        cards_per_worker=manifest.volume.cards_per_worker,
        nodes=_node_count(volume.get("nodes")),
        pilot_node=pilot_node(node, volume.get("nodes")),
        gpus=manifest.backend in ("cuda", "rocm") and (plan is None or plan.vendor != "none"),
        cores=_cores(stages), batch_size=manifest.volume.batch_size or batch,
        setup=measured_setup(run, stages, runner_started, _volume_node(node, volume),
                             on_nodes=bool(manifest.volume.inputs.on_nodes)),
        peak_memory_gib=_peak_memory(stages),
        **_pilot_threads(stages), torch_threads=task.torch_threads,
        card_memory_gib=plan.memory_per_card_gib if plan else None,
        lease_starts_at=manifest.lease.starts_at,
        calibration=calibration_of(stages), calibrate=manifest.volume.calibrate,
        evidence=_evidence(stages), pilot_items=len({item.id for item in items}),
        pilot_refused=len({item.id for item in items if item.status == "refused"}),
        pilot_timed_out=_timed_out(stages), item_timeout_s=task.item_timeout_s,
        fetch=pilot_transfers(run.run_dir)[1], collect=_collected(stages),
        outputs_on_nodes=manifest.volume.outputs_on_nodes)
    out = forecast(inputs).to_dict()
    return out if caps is None else with_fetch_caps(out, caps, count)


def _timed_out(stages: list[dict[str, Any]]) -> int:
    """The pilot's inputs interrupted at the item timeout (its pilot stage's ``timed_out``
    ids, from the node: counted only as a list of strings)."""
    facts = next((s.get("facts") or {} for s in stages if s.get("stage") == "pilot"), {})
    ids = facts.get("timed_out") if isinstance(facts, dict) else None
    return len({i for i in ids if isinstance(i, str)}) if isinstance(ids, list) else 0


def _evidence(stages: list[dict[str, Any]]) -> tuple[float, int, int] | None:
    """The pilot's evidence copy: (seconds, files, bytes), when its stage measured them."""
    return _measured(stages, "evidence")


def _collected(stages: list[dict[str, Any]]) -> tuple[float, int, int] | None:
    """A ``collect`` stage the run passed: (seconds, files, bytes it brought to the head)."""
    return _measured(stages, "collect")


def _measured(stages: list[dict[str, Any]], name: str) -> tuple[float, int, int] | None:
    """(seconds, files, bytes) of stage ``name`` when it passed and its facts count both
    (a node's numbers: what is not a whole number is dropped, never trusted)."""
    row = next((s for s in stages if s.get("stage") == name), None)
    if row is None or row.get("state") != "passed":
        return None
    facts, seconds = row.get("facts") or {}, stage_seconds(row)
    files, size = facts.get("files"), facts.get("bytes")
    if seconds is None or not isinstance(files, int) or not isinstance(size, int) \
            or isinstance(files, bool) or isinstance(size, bool):
        return None
    return seconds, max(0, files), max(0, size)


def samples(items: list[ItemOutcome], batch_size: int = 1) -> list[Sample]:
    """The accepted items' timings (``items``: the first outcome of each id, in seq order).

    A handler's batch is timed as a whole and its seconds shared equally by its items: the
    consecutive items (refused ones too) that carry the same share, at most ``batch_size``
    of them, are one measurement (``Sample.batch``), not that many."""
    out: list[Sample] = []
    group, size, last = -1, 0, None
    for item in items:
        if not _number(item.elapsed_s):
            last = None
            continue
        if batch_size > 1 and item.elapsed_s == last and size < batch_size:
            size += 1
        else:
            group, size, last = group + 1, 1, item.elapsed_s
        if item.status == "accepted":
            out.append(Sample(float(item.elapsed_s),  # type: ignore[arg-type]
                              int(item.input_bytes)  # type: ignore[arg-type]
                              if _number(item.input_bytes) else None,
                              group if batch_size > 1 else None))
    return out


def pilot_node(node: Any, nodes: Any) -> int | None:
    """Which of ``volume.nodes`` the pilot ran on (its cards are proven): 0 when the list
    is absent (the volume runs on the pilot's node), None when the pilot's is not listed."""
    if not isinstance(nodes, list) or not nodes:
        return 0
    ours = node_identity(node)
    return next((k for k, n in enumerate(nodes)
                 if isinstance(n, dict) and node_identity(n) == ours), None)


def _volume_node(node: dict[str, Any], volume: dict[str, Any]) -> dict[str, Any]:
    """The node the volume's head runs on: its first listed node, else the pilot's."""
    nodes = volume.get("nodes")
    if isinstance(nodes, list) and nodes and isinstance(nodes[0], dict):
        return nodes[0]
    return node


# The stages a node's card proof runs (bot/dispatch/card_proof.py) and those after the items.
PROOF_STAGES = ("prepare", "interpreter", "torch", "device", "compute", "interconnect")
AFTER_STAGES = ("pilot", "collect", "balance", "evidence")


def measured_setup(run: RunRecord, stages: list[dict[str, Any]],
                   runner_started: str | None, node: dict[str, Any], *,
                   on_nodes: bool = False) -> Setup:
    """What the pilot measured of the volume's setup: its diagnostics, its dispatch;
    ``on_nodes``: the volume's corpus is already on its nodes (checked, not uploaded)."""
    diagnostics = proof = 0.0
    seen = False
    for stage in stages:
        seconds = stage_seconds(stage)
        if seconds is None or stage.get("stage") in AFTER_STAGES:
            continue
        seen = True
        diagnostics += seconds
        if stage.get("stage") in PROOF_STAGES:
            proof += seconds
    dispatch = None
    began, started = _when(run.started_at), _when(runner_started)
    if began is not None and started is not None and started >= began:
        dispatch = (started - began).total_seconds()
    return Setup(diagnostics_s=diagnostics if seen else None, dispatch_s=dispatch,
                 proof_s=proof if seen else None, ssh=is_remote_node(node),
                 inputs_on_nodes=on_nodes, uploaded_bytes=pilot_transfers(run.run_dir)[0])


# The SSH dispatch's record of a run on its node (bot/dispatch/upload.py's layout): what its
# upload sent (``uploaded``: bytes by kind) and what its fetch brought back (``fetched``:
# ``{"seconds", "files", "bytes"}``, written by the fetch once it is measured).
LAYOUT_FILE = "remote.json"


def pilot_transfers(run_dir: Path) -> tuple[int | None, tuple[float, int, int] | None]:
    """(bytes the pilot's upload sent, its fetch's (seconds, files, bytes)) from the run's
    ``remote.json``; None where not recorded (a local pilot, an older record). Numbers
    that are not numbers are dropped, never trusted."""
    try:
        layout = json.loads((run_dir / LAYOUT_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None, None
    if not isinstance(layout, dict):
        return None, None
    sent = layout.get("uploaded")
    uploaded = sum(v for v in sent.values() if _number(v) and isinstance(v, int)) \
        if isinstance(sent, dict) else None
    got = layout.get("fetched")
    fetch = None
    if isinstance(got, dict) and all(_number(got.get(k)) for k in ("seconds", "files", "bytes")):
        fetch = (float(got["seconds"]), int(got["files"]), int(got["bytes"]))
    return uploaded, fetch


def stage_seconds(stage: dict[str, Any]) -> float | None:
    began, ended = _when(stage.get("started_at")), _when(stage.get("ended_at"))
    if began is None or ended is None:
        return None
    return max(0.0, (ended - began).total_seconds())


def _when(value: Any) -> datetime | None:
    moment = read_time(value)
    if moment is None or moment.tzinfo:
        return moment
    return moment.replace(tzinfo=timezone.utc)


def _cores(stages: list[dict[str, Any]]) -> int | None:
    """The pilot node's cores, as its interpreter (else device) stage counted them."""
    by_name = {s.get("stage"): s for s in stages}
    for name in ("interpreter", "device"):
        value = ((by_name.get(name) or {}).get("facts") or {}).get("cpu_count")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


NOT_LISTED = "counted from"  # the count is the manifest's, not a listing's


def _volume_inputs(run: RunRecord, volume: dict[str, Any]
                   ) -> tuple[int, int | None, int | None, str, str | None]:
    """(count, total bytes, largest, where, error) of the volume's inputs."""
    spec = volume.get("inputs") or {}
    if not spec.get("dir"):  # a corpus only the nodes hold: listed there at dispatch
        count = int(spec.get("expected_count") or 0)
        return (count, None, None, f"{NOT_LISTED} volume.inputs.expected_count {count:,}; the "
                f"corpus is only on the nodes (volume.inputs.on_nodes {spec.get('on_nodes')}) "
                "and the head node lists it at the volume's dispatch; sizes unknown", None)
    directory = (run.project_dir or Path(".")) / str(spec.get("dir") or "")
    where = f"{directory.resolve()} on the bot host"
    try:
        files = list_dir(str(directory.resolve()), str(spec.get("pattern") or "*"))
    except InputsError as exc:
        if run.remote:
            # Listing on the node itself is not done yet: say so instead of guessing.
            count = int(spec.get("expected_count") or 0)
            return (count, None, None, f"{NOT_LISTED} volume.inputs.expected_count {count:,}; "
                    "sizes unknown (the inputs live on the node)", None)
        return 0, None, None, where, f"cannot list the volume's inputs: {exc}"
    sizes = [f.size for f in files]
    return len(files), sum(sizes), max(sizes, default=None), where, None


def healthy_cards(stages: list[dict[str, Any]]) -> int | None:
    """How many healthy cards the run proved (bot.pilot.cards), when a stage measured it."""
    cards = run_healthy_cards(stages)
    return None if cards is None else len(cards)


def _pilot_threads(stages: list[dict[str, Any]]) -> dict[str, Any]:
    """The torch threads the pilot stage measured its items with, and why (its facts)."""
    facts = next((s.get("facts") or {} for s in stages if s.get("stage") == "pilot"), {})
    threads, why = facts.get("torch_threads"), facts.get("torch_threads_why")
    ok = isinstance(threads, int) and not isinstance(threads, bool) and threads > 0
    return {"pilot_threads": threads if ok else None,
            "pilot_threads_why": str(why) if ok and why else None}


def _peak_memory(stages: list[dict[str, Any]]) -> float | None:
    for stage in stages:
        if stage.get("stage") == "memory":
            facts = stage.get("facts") or {}
            for key in ("peak_reserved_gib", "peak_allocated_gib"):
                if _number(facts.get(key)):
                    return float(facts[key])
    return None


# The events that say when each attempt's work stage ran (bot.service.follower reads these).
ATTEMPT_EVENTS = ("run.started", "stage.started", "stage.passed", "stage.failed", "progress",
                  "volume.workers")


def check_volume(volume_run: RunRecord, stages: list[dict[str, Any]],
                 pilot_forecast: dict[str, Any] | None, events: list[Event] | None = None,
                 done: int | None = None) -> dict[str, Any] | None:
    """After the volume: its actual processing time beside the forecast's, and the error.

    Actual: the seconds the stage that ran the items (``volume``, else ``pilot``) ran, added
    over the attempts (``events``: their ``ATTEMPT_EVENTS``), not the wall time since the
    first one. Forecast: what that stage does, Ray's start once per attempt and the items'
    processing; when the attempts ran ``done`` items of the volume's ``volume_count``
    (stopped, failed), the processing of those items only."""
    if not pilot_forecast or not pilot_forecast.get("possible"):
        return None
    spans = attempt_seconds(events or []) or [s for s in [work_seconds(stages)] if s is not None]
    if not spans:
        return None
    actual = sum(spans)
    count = int(pilot_forecast.get("volume_count") or 0)
    per_start = float(pilot_forecast.get("ray_start_s") or 0.0)
    share = 1.0 if done is None or not count else min(1.0, done / count)
    if "proc_mid_s" in pilot_forecast:
        # Ray's start per attempt: its own range when the forecast gives one (measured once)
        starts = {k: float(pilot_forecast.get(f"ray_start_{k}_s") or per_start)
                  for k in ("low", "high")}
        starts["mid"] = per_start
        low, mid, high = (starts[k] * len(spans) + share * float(pilot_forecast[f"proc_{k}_s"])
                          for k in ("low", "mid", "high"))
    else:  # a forecast stored before the middle and the setup were figures of their own
        low, high = float(pilot_forecast["low_s"]), float(pilot_forecast["high_s"])
        mid = low
    error = (actual - mid) / mid * 100 if mid > 0 else None
    scope = "the whole volume" if share >= 1.0 else \
        f"the {done:,} of {count:,} items its attempts recorded"
    formula = (f"actual {' + '.join(f'{s:.3g} s' for s in spans)} = {actual:.3g} s "
               f"({plural(len(spans), 'attempt')}); forecast for {scope}: "
               f"{plural(len(spans), 'Ray start')} × {per_start:g} s + processing = {mid:.3g} s "
               f"(range {low:.3g} – {high:.3g} s); "
               + (f"({actual:.3g} − {mid:.3g}) ÷ {mid:.3g} = {error:+.1f}%"
                  if error is not None else "no error: the forecast is 0 s"))
    started = [list_total(e.data, "workers") for e in events or []
               if e.type == "volume.workers"]
    ray = ray_start_seconds(events or [])
    if ray:
        formula += (f"; Ray and its workers took {' + '.join(f'{r:.3g} s' for r in ray)} "
                    f"to start (forecast {per_start:g} s each"
                    + (", its stop included)" if pilot_forecast.get("calibrated") else ")"))
    return {"actual_s": round(actual, 3), "attempts": len(spans),
            "ray_start_measured_s": [round(r, 3) for r in ray],
            "workers_forecast": pilot_forecast.get("workers"),
            "workers_started": started[-1] if started else None,
            "attempt_s": [round(s, 3) for s in spans], "items_done": done,
            "items_total": count, "scored": "whole" if share >= 1.0 else "partial",
            "forecast_low_s": round(low, 3), "forecast_mid_s": round(mid, 3),
            "forecast_high_s": round(high, 3),
            "error_pct": None if error is None else round(error, 1),
            "within_range": low <= actual <= high, "formula": formula,
            "calibrated": bool(pilot_forecast.get("calibrated")),
            # the wall time shown before approval (setup included), told beside, not scored
            **{f"wall_{k}_s": pilot_forecast[f"{k}_s"] for k in ("low", "high")
               if isinstance(pilot_forecast.get(f"{k}_s"), (int, float))},
            # the forecast scored against was made on the proven nodes (bot/service/proven.py)
            **({"proven": pilot_forecast["proven"]} if pilot_forecast.get("proven") else {})}


def attempt_seconds(events: list[Event]) -> list[float]:
    """Seconds the work stage (``volume``, else ``pilot``) ran in each attempt: from its
    ``stage.started`` to its end, or (a runner killed mid-stage) to the attempt's last
    event. Attempts are split at ``run.started``; the time between them is not counted."""
    attempts: list[list[Event]] = []
    for event in events:
        if event.type == "run.started" or not attempts:
            attempts.append([])
        attempts[-1].append(event)
    names = {e.stage for e in events if e.type == "stage.started"}
    work = next((name for name in WORK_STAGES if name in names), None)
    spans = []
    for attempt in attempts:
        began = next((e for e in attempt if e.type == "stage.started" and e.stage == work),
                     None)
        if began is None:
            continue
        after = [e for e in attempt if e.seq > began.seq]
        end = next((e for e in after if e.type in ("stage.passed", "stage.failed")
                    and e.stage == work), after[-1] if after else began)
        start, stop = _when(began.ts), _when(end.ts)
        if start is not None and stop is not None:
            spans.append(max(0.0, (stop - start).total_seconds()))
    return spans


def ray_start_seconds(events: list[Event]) -> list[float]:
    """Per attempt, from its work stage's start to its workers' start (``volume.workers``):
    what the forecast's "Ray start" estimates."""
    out: list[float] = []
    began: datetime | None = None
    for event in events:
        if event.type == "stage.started" and event.stage in WORK_STAGES:
            began = _when(event.ts)
        elif event.type == "volume.workers" and began is not None:
            ready = _when(event.ts)
            if ready is not None:
                out.append(max(0.0, (ready - began).total_seconds()))
            began = None
    return out


def work_seconds(stages: list[dict[str, Any]]) -> float | None:
    """Seconds the stage that processed the items ran (``volume``, else ``pilot``), from
    its row: first start to last end (one attempt; ``attempt_seconds`` for several)."""
    by_name = {s.get("stage"): s for s in stages}
    for name in WORK_STAGES:
        stage = by_name.get(name)
        if stage:
            seconds = stage_seconds(stage)
            if seconds is not None:
                return seconds
    return None


def _node_count(nodes: Any) -> int:
    """volume.nodes: a list of nodes, or (the older form) a count; absent: the pilot's."""
    if isinstance(nodes, list):
        return max(1, len(nodes))
    return int(nodes) if isinstance(nodes, int) and nodes > 0 else 1
