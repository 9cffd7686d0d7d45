"""Small fakes implementing our protocols (no mocks of our own code)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bot.dispatch.base import LOG_TAIL_BYTES, RunHandle, read_tail
from runner.events import Event, read_events, utc_now


class RunDirDispatcher:
    """What the fake dispatchers share: their "runner" writes in the bot's own run
    directory, so there is nothing to fetch back and nothing to close."""

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        return read_events(str(handle.run_dir / "events.jsonl"), offset)

    def fetch_results(self, handle: RunHandle) -> None:
        return None

    def clean_up(self, handle: RunHandle) -> list[str]:
        return []

    def log_tail(self, handle: RunHandle, limit: int = LOG_TAIL_BYTES) -> str:
        return read_tail(handle.run_dir / "runner.log", limit)

    def close(self) -> None:
        return None


class ScriptedDispatcher(RunDirDispatcher):
    """A dispatcher whose "runner" writes a prepared list of events, in steps.

    ``script(run_id)`` returns the events' payloads; ``step`` events are appended each
    time the service reads, so a test can observe a run in the middle.
    """

    def __init__(self, script: Any, *, step: int = 1000, exit_code: int = 0) -> None:
        self.script = script
        self.step = step
        self.exit_code_value = exit_code
        self.pending: dict[str, list[dict[str, Any]]] = {}
        self.seq: dict[str, int] = {}
        self.started: list[RunHandle] = []
        self.stalled: set[str] = set()  # alive but silent (a SIGSTOPped runner)

    def start(self, handle: RunHandle) -> int | None:
        self.started.append(handle)
        self.pending[handle.run_id] = list(self.script(handle.run_id))
        self.seq.setdefault(handle.run_id, 0)
        return None

    def _advance(self, handle: RunHandle) -> None:
        if handle.run_id in self.stalled:
            return
        queue = self.pending.get(handle.run_id, [])
        batch, self.pending[handle.run_id] = queue[: self.step], queue[self.step:]
        with open(handle.run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
            for payload in batch:
                self.seq[handle.run_id] += 1
                data = {k: v for k, v in payload.items() if k != "type"}
                fh.write(Event(self.seq[handle.run_id], payload["type"], handle.run_id,
                               utc_now(), data).to_line())

    def read_events(self, handle: RunHandle, offset: int) -> tuple[list[Event], int]:
        self._advance(handle)
        return super().read_events(handle, offset)

    def is_alive(self, handle: RunHandle) -> bool:
        return handle.run_id in self.stalled or bool(self.pending.get(handle.run_id))

    def exit_code(self, handle: RunHandle) -> int | None:
        return None if self.is_alive(handle) else self.exit_code_value

    def stop(self, handle: RunHandle) -> None:
        self.pending[handle.run_id] = []


def item_done(item: str, *, refused: bool, reason: str, category: str) -> dict[str, Any]:
    """An ``item.done`` payload as the runner writes it: refused with its reason, or
    accepted in its category."""
    if refused:
        return {"type": "item.done", "id": item, "status": "refused", "reason": reason}
    return {"type": "item.done", "id": item, "status": "accepted", "category": category}


def pilot_script(ids: list[str], *, refuse: tuple[str, ...] = ("doc-07",),
                 category: str = "invoice", lie: bool = False,
                 drop: tuple[str, ...] = (), finish: bool = True) -> list[dict[str, Any]]:
    """Events of a healthy pilot over ``ids``; ``lie`` claims a good balance anyway."""
    out: list[dict[str, Any]] = [{"type": "run.started"}]
    for stage in ("prepare", "interpreter", "environment", "torch", "device", "compute"):
        out += [{"type": "stage.started", "stage": stage},
                {"type": "stage.passed", "stage": stage, "facts": {"version": "x"}}]
    out += [{"type": "stage.skipped", "stage": s, "reason": "none listed"}
            for s in ("interconnect", "extensions", "memory")]
    out.append({"type": "stage.started", "stage": "pilot"})
    done = [i for i in ids if i not in drop]
    for n, item in enumerate(done, 1):
        out.append(item_done(item, refused=item in refuse, reason="not valid UTF-8",
                             category=category))
        out.append({"type": "progress", "done": n, "total": len(ids)})
    out.append({"type": "stage.passed", "stage": "pilot", "facts": {"done": len(done)}})
    refused = len([i for i in done if i in refuse])
    ok = lie or not drop
    out += [{"type": "stage.started", "stage": "balance"},
            {"type": "balance", "accepted": len(ids) - refused if lie else len(done) - refused,
             "refused": refused, "total": len(ids), "ok": ok, "problems": [],
             "by_category": {category: len(done) - refused}},
            {"type": "stage.passed", "stage": "balance", "facts": {"ok": ok}},
            {"type": "stage.skipped", "stage": "evidence", "reason": "no copy_to"}]
    if finish:
        out.append({"type": "run.finished", "status": "passed", "stage_reached": "balance",
                    "first_error": None})
    return out


def write_manifest(root: Path, *, name: str = "demo", approvers: str = "[alice]",
                   two_person: str = "false", extra: str = "", count: int = 4,
                   copy_to: bool = False) -> Path:
    """A small valid manifest over ``count`` documents under ``root``."""
    docs = root / "data" / "pilote"
    docs.mkdir(parents=True, exist_ok=True)
    for n in range(1, count + 1):
        (docs / f"doc-{n:02d}.txt").write_text(f"invoice number {n} total due", encoding="utf-8")
    path = root / "manifest.yaml"
    path.write_text(f"""apiVersion: preflight/v1
name: {name}
purpose: inference
hardware: {{gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0"}}
backend: cpu
preparation: pytorch
inputs: {{dir: data/pilote, pattern: "doc-*.txt", expected_count: {count}, expected_refusals: []}}
task: {{kind: classify, handler: "runner.workloads.classify:handle",
       categories: [invoice, contract]}}
success: {{min_accepted: {count}, max_refused: 0, balance_ok: true}}
approvals: {{approvers: {approvers}, two_person: {two_person}}}
{"results: {copy_to: evidence}" if copy_to else ""}
{extra}
""", encoding="utf-8")
    return path


def events_file(run_dir: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
