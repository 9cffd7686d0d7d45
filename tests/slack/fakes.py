"""Small fakes for the Slack tests: a dispatcher that replays prepared events, a project."""

from __future__ import annotations

import csv
import shutil
import threading
import time
from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle
from runner.events import OPTIONAL_STAGES, STAGES, Event, utc_now
from tests.bot.fakes import RunDirDispatcher, item_done

CATEGORIES = ("invoice", "contract", "support", "research")
PILOT_MANIFEST = Path(__file__).resolve().parents[2] / "manifests" / "pilote.yaml"


def make_project(root: Path, count: int = 12, refused: tuple[str, ...] = ("doc-07",),
                 volume: int | None = None, two_person: bool = False,
                 approvers: tuple[str, ...] = ("U0APPROVER",), real_docs: bool = False,
                 lease_starts_at: str | None = None) -> str:
    """A project with ``count`` inputs and a manifest for it (in root/manifests); its text.

    ``real_docs`` copies the repository's 12 pilot documents (for the real runner).
    """
    data = root / "proj" / "data" / "pilote"
    data.mkdir(parents=True)
    repo = PILOT_MANIFEST.parents[1]
    for name in ("requirements-rebuild.txt",):
        if (repo / name).is_file():
            shutil.copy2(repo / name, root / "proj" / name)
    if real_docs:
        for doc in sorted((repo / "data" / "pilote").iterdir()):
            shutil.copy2(doc, data / doc.name)
    for i in range(1, count + 1):
        if not real_docs:
            (data / f"doc-{i:02d}.txt").write_text(f"document {i}\n")
    text = PILOT_MANIFEST.read_text(encoding="utf-8")
    text = text.replace("  dir: ..\n", "  dir: ../proj\n")
    text = text.replace("expected_count: 12", f"expected_count: {count}")
    text = text.replace("expected_refusals: [doc-07]", f"expected_refusals: [{', '.join(refused)}]")
    text = text.replace("approvers: [alice, U0APPROVER]", f"approvers: [{', '.join(approvers)}]")
    text = text.replace("two_person: false", f"two_person: {str(two_person).lower()}")
    text = text.replace("min_accepted: 11", f"min_accepted: {count - len(refused)}")
    if volume is not None:
        vol = root / "proj" / "data" / "volume"
        vol.mkdir(parents=True)
        for i in range(1, volume + 1):
            (vol / f"doc-{i:02d}.txt").write_text(f"volume document {i}\n")
        text += (f"volume:\n  inputs:\n    dir: data/volume\n    pattern: \"doc-*.txt\"\n"
                 f"    expected_count: {volume}\n")
    if lease_starts_at is not None:
        text += f"lease:\n  starts_at: \"{lease_starts_at}\"\n"
    (root / "manifests").mkdir(exist_ok=True)
    (root / "manifests" / "pilote.yaml").write_text(text, encoding="utf-8")
    return text


def pilot_events(run_id: str, ids: list[str], refused: tuple[str, ...] = ("doc-07",),
                 fail_stage: str | None = None, seconds: float | None = None
                 ) -> list[dict[str, Any]]:
    """The event stream of a pilot as the runner writes it (without seq/ts/run)."""
    out: list[dict[str, Any]] = [{"type": "run.started"}]
    failed = None
    for stage in STAGES:
        if stage in OPTIONAL_STAGES:
            continue  # a pilot spec without a calibration (as the runner leaves it out)
        if failed:
            out.append({"type": "stage.skipped", "stage": stage, "reason": f"{failed} failed"})
            continue
        out.append({"type": "stage.started", "stage": stage})
        if stage == fail_stage:
            failed = stage
            out.append({"type": "stage.failed", "stage": stage, "error": {
                "type": "RuntimeError", "message": "CUDA error: no kernel image is available",
                "where": "stages/compute.py:42", "hint": "install the torch build for this GPU"}})
            continue
        if stage == "pilot":
            for n, item in enumerate(ids, 1):
                out.append(item_done(item, refused=item in refused, reason="not a document",
                                     category=CATEGORIES[n % len(CATEGORIES)]))
                if seconds is not None:  # the runner's per-item measurements
                    out[-1].update(elapsed_s=seconds, input_bytes=11)
                if n % max(1, len(ids) // 4) == 0 or n == len(ids):
                    out.append({"type": "progress", "done": n, "total": len(ids)})
        if stage == "balance":
            acc = len([i for i in ids if i not in refused])
            out.append({"type": "balance", "accepted": acc, "refused": len(ids) - acc,
                        "total": len(ids), "ok": True, "problems": [],
                        "sample": [{"id": ids[0], "category": CATEGORIES[1],
                                    "excerpt": "document 1"}]})
        if stage == "evidence":
            out.append({"type": "evidence", "dest": "evidence/pilote-demo", "files": 9,
                        "verified": True, "bytes": 1234})
        out.append({"type": "stage.passed", "stage": stage, "facts": {"checked": 1}})
    status = "failed" if failed else "passed"
    out.append({"type": "run.finished", "status": status, "stage_reached": fail_stage or
                "evidence", "exit_code": 1 if failed else 0})
    return out


class ReplayDispatcher(RunDirDispatcher):
    """Writes a prepared event stream into the run's events.jsonl, like a runner would.

    ``pause_after`` stops writing after that many events until ``release()``: the bot can
    be stopped and restarted in the middle of a run.
    """

    def __init__(self, *, fail_stage: str | None = None, pause_after: int | None = None,
                 refused: tuple[str, ...] = ("doc-07",), pace: float = 0.0,
                 seconds: float | None = None) -> None:
        self.fail_stage = fail_stage
        self.seconds = seconds
        self.pace = pace  # seconds between events (a runner that takes its time)
        self._tick = threading.Event()
        self.pause_after = pause_after
        self.refused = refused
        self.gate = threading.Event()
        self.gates: dict[str, threading.Event] = {}  # per run, besides the common gate
        self.started: list[str] = []
        self._threads: dict[str, threading.Thread] = {}

    def release(self, run_id: str | None = None) -> None:
        """Let every paused run go on, or only ``run_id``."""
        if run_id is None:
            self.gate.set()
        else:
            self.gates.setdefault(run_id, threading.Event()).set()

    def start(self, handle: RunHandle) -> int | None:
        import json

        spec = json.loads(handle.spec_path.read_text())
        ids = sorted(p.name.rsplit(".", 1)[0] for p in
                     Path(spec["inputs"]["dir"]).glob(spec["inputs"].get("pattern", "*")))
        events = pilot_events(handle.run_id, ids, self.refused, self.fail_stage, self.seconds)
        copy_to = (spec.get("results") or {}).get("copy_to")
        for event in events:  # the runner copies the evidence to copy_to/<run id>
            if event["type"] == "evidence" and copy_to:
                event["dest"] = f"{copy_to}/{handle.run_id}"
        self.started.append(handle.run_id)
        thread = threading.Thread(target=self._write, args=(handle, events, ids), daemon=True)
        self._threads[handle.run_id] = thread
        thread.start()
        return None

    def _write(self, handle: RunHandle, events: list[dict[str, Any]], ids: list[str]) -> None:
        with open(handle.run_dir / "balance.csv", "w", newline="") as fh:
            writer = csv.writer(fh)
            writer.writerow(["id", "status", "category", "reason"])
            for i in ids:
                writer.writerow([i, "refused" if i in self.refused else "accepted", "", ""])
        with open(handle.run_dir / "events.jsonl", "a", encoding="utf-8") as fh:
            for seq, data in enumerate(events, 1):
                if self.pause_after is not None and seq == self.pause_after + 1:
                    own = self.gates.setdefault(handle.run_id, threading.Event())
                    deadline = time.monotonic() + 60
                    while not (self.gate.is_set() or own.is_set()):
                        if time.monotonic() > deadline:
                            break
                        own.wait(0.05)
                body = {k: v for k, v in data.items() if k != "type"}
                fh.write(Event(seq, data["type"], handle.run_id, utc_now(), body).to_line())
                fh.flush()
                if self.pace:
                    self._tick.wait(self.pace)

    def is_alive(self, handle: RunHandle) -> bool:
        thread = self._threads.get(handle.run_id)
        return thread is not None and thread.is_alive()

    def exit_code(self, handle: RunHandle) -> int | None:
        return None if self.is_alive(handle) else 0

    def stop(self, handle: RunHandle) -> None:
        self.gate.set()
