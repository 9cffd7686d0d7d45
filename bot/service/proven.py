"""The volume's forecast again once every node of it has proven its cards (issue 23).

The pilot's forecast, made before approval, knows only the pilot's node: every other node
of ``volume.nodes`` is counted with its share of the rent. At the volume's dispatch each
node's card proof (``bot/dispatch/card_proof.py``) reports the cards it left healthy as a
``dispatch.node`` step with ``phase: proved``. When the last node of the attempt has
reported, ``ProvenForecast.node_proved`` makes the forecast again from the pilot's own
measurements with each node's real healthy cards (``forecast_for(..., node_cards=...)``),
stores it with the volume run (``runs.forecast``, with a ``proven`` summary), and, when
it differs from the approved one, posts one line in the thread ("4 nodes proven: 30
healthy cards of 32; forecast now …, was …"). A corpus only the nodes hold
(``volume.inputs.on_nodes`` without ``dir``) is counted from the head node's listing of
that dispatch (``corpus_listed`` stores its ids as the ones the balance expects).

The time limit: the driver gets ``volume.time_limit_s`` in its spec, sent to the head when
it is launched, after every proof (the widened limit is the answer to the last ``proved``
step, a ``Decision`` the dispatch writes into the head's spec; nothing here edits a
file). A limit derived from the forecast (the manifest sets none) is widened to the new
forecast's (``bot.pilot.volume_limits``: 2 × high + 30 min, cut to the lease's end)
when that is longer; it is never narrowed below the limit the approver saw. A limit the
manifest sets is kept. After the volume, the check (``check_volume``) scores the actual
time against this forecast: the cards really used.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot.dispatch.corpus import LISTING_FILE, head_node, iter_head_rows
from bot.errors import DispatchError
from bot.pilot.forecast import duration, plural, proven_cards
from bot.pilot.plan import Plan
from bot.pilot.volume_limits import volume_limits
from bot.service.forecast_inputs import forecast_for
from bot.store import Run, Store
from runner.inputs import item_id

PROVED = "proved"


def corpus_listed(store: Store, run_id: str) -> list[str] | None:
    """A corpus only the nodes hold, listed on the head node (``bot/dispatch/corpus_head``):
    its ids become the ones the volume run's balance expects (stored); None: no listing."""
    run_dir = store.run_record(run_id).run_dir
    if not (run_dir / LISTING_FILE).exists():
        return None
    ids = sorted(item_id(name) for name, _size, _sha in iter_head_rows(run_dir))
    store.set_expected_ids(run_id, ids)
    return ids


def node_cards(steps: list[dict[str, Any]], nodes: int) -> tuple[int | None, ...] | None:
    """Each node's healthy cards from the attempt's ``proved`` steps (the latest per node,
    by ``index``); None until every one of the ``nodes`` has reported. A step's ``cards``:
    the healthy cards' indices; None: its stages judged no card (its share counts)."""
    found: dict[int, int | None] = {}
    for step in steps:
        index = step.get("index")
        if step.get("phase") != PROVED or not isinstance(index, int) or not 0 <= index < nodes:
            continue
        cards = step.get("cards")
        found[index] = len(cards) if isinstance(cards, list) else None
    if len(found) < nodes:
        return None
    return tuple(found[i] for i in range(nodes))


def _cpus_only(steps: list[dict[str, Any]]) -> bool:
    """A proof of CPUs only (``cards: []``; a GPU node with no healthy card is refused)."""
    return any(s.get("phase") == PROVED and s.get("cards") == [] for s in steps)


class ProvenForecast:
    """Makes, stores and announces a volume's forecast on its proven nodes."""

    def __init__(self, store: Store) -> None:
        self.store = store
        self._lock = threading.Lock()  # the proofs report from several threads at once

    def node_proved(self, run_id: str) -> dict[str, Any] | None:
        """After a ``proved`` step of ``run_id``: once every node of this attempt has
        reported, the new forecast (stored; its ``proven`` summary says what changed and
        ``differs`` whether to tell the thread); None before that, or for any other run."""
        with self._lock:
            run = self.store.run(run_id)
            listed = run.volume_nodes
            if run.kind != "volume" or not run.parent_run \
                    or not isinstance(listed, list) or len(listed) < 2:
                return None
            proven = run.forecast.proven if run.forecast is not None else {}
            if proven.get("started_at") == run.started_at:
                return None  # this attempt's is made already
            steps = [e.data for e in self.store.dispatch_events(run_id,
                                                                since=run.started_at)]
            cards = node_cards(steps, len(listed))
            if cards is None or _cpus_only(steps):
                return None  # not every node yet; or a CPU volume: no cards to count
            new = self._forecast(run, cards)
            if new is not None:
                self.store.update_run(run_id, forecast=new)
            return new

    def _forecast(self, run: Run, cards: tuple[int | None, ...]
                  ) -> dict[str, Any] | None:
        pilot = self.store.run(str(run.parent_run))
        approved = pilot.forecast.values if pilot.forecast is not None else {}
        started = self.store.events_of_type(pilot.id, "run.started")
        new = forecast_for(pilot, self.store.stages(pilot.id),
                           self.store.item_outcomes(pilot.id),
                           runner_started=started[-1].ts if started else None,
                           node_cards=cards, listing=_listed(run.run_dir))
        if new is None:
            return None
        plan = run.plan or pilot.plan
        rented = plan.total_cards if plan else 1
        limit = self._time_limit(run, plan, new)
        differs = _shape(new) != _shape(approved)
        summary = {"started_at": run.started_at, "node_cards": list(cards),
                   "healthy": proven_cards(cards, rented, len(cards)), "rented": rented,
                   "nodes": len(cards), "approved": _range(approved), "now": _range(new),
                   "differs": differs, "time_limit": limit}
        summary["line"] = proven_line(summary)
        return {**new, "proven": summary}

    def _time_limit(self, run: Run, plan: Plan | None,
                    new: dict[str, Any]) -> dict[str, Any]:
        """The driver's time limit on the new forecast: kept, or widened (never narrowed
        below what the approver saw); a widened one is the start's to put in the spec the
        head is about to get (the ``proved`` step's answer, ``Decision``)."""
        path = Path(str(run.spec_path))
        try:
            spec = json.loads(path.read_text(encoding="utf-8"))
            was = float((spec.get("volume") or {}).get("time_limit_s") or 0)
        except (OSError, ValueError, AttributeError) as exc:
            raise DispatchError(f"{path}: cannot read the volume's time limit: {exc}") from exc
        manifest = run.manifest_json  # as volume_limits reads it (the checked manifest)
        volume = run.manifest.volume if run.manifest is not None else None
        given = volume.time_limit_s if volume is not None else None
        if isinstance(given, (int, float)) and given > 0:
            return {"s": was, "was_s": was, "how": "kept", "why": "volume.time_limit_s"}
        if not new.get("possible"):
            return {"s": was, "was_s": was, "how": "kept",
                    "why": "no forecast on the proven nodes"}
        limits = volume_limits(manifest, plan.to_dict() if plan else {}, new,
                               datetime.now(timezone.utc))
        if limits is None or limits.time_limit_s <= was:
            return {"s": was, "was_s": was, "how": "kept",
                    "why": "the approved limit covers the new forecast"}
        return {"s": limits.time_limit_s, "was_s": was, "how": "widened",
                "why": limits.time_why}


def _listed(run_dir: Path) -> tuple[int, int | None, int | None, str] | None:
    """(count, bytes, largest, where) of a corpus only the nodes hold, as the head node
    listed it at this dispatch (None: the bot's own copy was listed, or none)."""
    if not (run_dir / LISTING_FILE).exists():
        return None
    count, total, largest = 0, 0, None
    for _name, size, _sha in iter_head_rows(run_dir):  # a line at a time
        count, total = count + 1, total + size
        largest = size if largest is None or size > largest else largest
    return (count, total, largest,
            f"on the head node {head_node(run_dir)} at the volume's dispatch")


def _shape(fc: Mapping[str, Any]) -> tuple[Any, ...]:
    """What a reader compares: whether there is a forecast, its workers and its range."""
    if not fc.get("possible"):
        return (False,)
    return (True, fc.get("workers"), round(float(fc.get("low_s") or 0)),
            round(float(fc.get("high_s") or 0)))


def _range(fc: Mapping[str, Any]) -> dict[str, Any]:
    if not fc.get("possible"):
        return {"possible": False, "reason": fc.get("reason")}
    return {"possible": True, "workers": fc.get("workers"), "low_s": fc.get("low_s"),
            "mid_s": fc.get("mid_s"), "high_s": fc.get("high_s")}


def proven_line(summary: dict[str, Any]) -> str:
    """"4 nodes proven: 30 healthy cards of 32; forecast now 2 h 10 min – 2 h 40 min (30
    workers), was 1 h 55 min – 2 h 20 min (32 workers); time limit widened to …"."""
    def shown(r: dict[str, Any]) -> str:
        if not r.get("possible"):
            return f"none ({r.get('reason')})" if r.get("reason") else "none"
        return (f"{duration(float(r['low_s']))} – {duration(float(r['high_s']))} "
                f"({plural(int(r.get('workers') or 0), 'worker')})")

    line = (f"{plural(int(summary['nodes']), 'node')} proven: {summary['healthy']} healthy "
            f"card{'s' if summary['healthy'] != 1 else ''} of {summary['rented']}; forecast "
            f"now {shown(summary['now'])}, was {shown(summary['approved'])}")
    limit = summary.get("time_limit") or {}
    if limit.get("how") == "widened":
        line += (f"; time limit widened to {duration(float(limit['s']))} (was "
                 f"{duration(float(limit['was_s']))}: {limit['why']})")
    elif limit:
        line += f"; time limit kept at {duration(float(limit['s']))} ({limit['why']})"
    return line
