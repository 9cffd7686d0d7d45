"""Writes ``report.html`` (and the Slack picture) for a run, into its run directory and
its evidence copy.

The page itself is ``bot.messages.report.render_report`` (pure); this module gathers what
it shows from the store and the disk, and writes the files atomically. In the evidence copy
the report is added to ``SHA256SUMS`` (its line replaced on a rewrite), so
``preflight verify`` still accepts the copy.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot.errors import PreflightError
from bot.messages.report import ReportData, parse_time, render_report, stage_bars
from bot.store import Store
from runner.evidence import SUMS, file_sha256, is_url

REPORT = "report.html"
PICTURE = "report-summary.png"
MAX_CHECKSUMS = 2000


class ReportError(PreflightError):
    """The report cannot be written (names the path)."""


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    picture: Path | None
    evidence_copy: str | None  # where the copy was updated, or None
    note: str = ""  # why the evidence copy was not updated, when it was not


def gather(store: Store, run_id: str) -> ReportData:
    run = store.get_run(run_id)
    stages = store.stages(run_id)
    starts = [t for t in (parse_time(s.get("started_at")) for s in stages) if t is not None]
    zero = min(starts) if starts else None
    times: list[float] = []
    points: list[tuple[float, float]] = []
    for item in store.item_outcomes(run_id):
        when = parse_time(item.ts)
        if zero is not None and when is not None:
            times.append((when - zero).total_seconds())
        seconds, size = item.elapsed_s, item.input_bytes
        if item.status == "accepted" and isinstance(seconds, (int, float)) \
                and isinstance(size, int):
            points.append((float(size), float(seconds)))
    sums, source = _checksums(run)
    parent = store.get_run(run["parent_run"]) if run.get("parent_run") else None
    return ReportData(run=run, stages=stages, decisions=store.decisions(run_id),
                      generated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      item_times=times, item_points=points, checksums=sums,
                      checksums_from=source,
                      parent_forecast=(parent or {}).get("forecast"))


def _checksums(run: dict[str, Any]) -> tuple[list[tuple[str, str]], str]:
    dest = _local_evidence(run)
    if dest is not None:
        try:
            lines = (Path(dest) / SUMS).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            return [], f"the evidence copy's {SUMS} cannot be read: {exc}"
        pairs = [(ln[:64], ln[66:]) for ln in lines if len(ln) > 66 and ln[66:] != REPORT]
        return pairs, f"{SUMS} of the evidence copy at {dest} (the report adds its own line)"
    run_dir = Path(run["run_dir"])
    pairs = []
    for path in sorted(p for p in run_dir.rglob("*") if p.is_file()):
        rel = path.relative_to(run_dir).as_posix()
        skip = rel in (REPORT, PICTURE) or rel.startswith(("ledger.sqlite", "runner."))
        if skip or len(pairs) >= MAX_CHECKSUMS:
            continue
        try:
            pairs.append((file_sha256(str(path)), rel))
        except OSError:
            continue
    return pairs, (f"computed over the run directory {run_dir} (no local evidence copy; "
                   "the ledger, which changes on resume, is left out)")


def _local_evidence(run: dict[str, Any]) -> str | None:
    dest = str((run.get("evidence") or {}).get("dest") or "")
    if not dest or is_url(dest) or not os.path.isabs(dest):
        return None
    return dest if (Path(dest) / SUMS).is_file() else None


def write_report(store: Store, run_id: str) -> ReportFiles:
    """Write (or rewrite) the run's report.html and summary picture; update the evidence."""
    data = gather(store, run_id)
    run_dir = Path(data.run["run_dir"])
    html = render_report(data).encode("utf-8")
    target = run_dir / REPORT
    _atomic(target, html)
    picture = _picture(data, run_dir)
    dest = _local_evidence(data.run)
    if dest is None:
        note = ("no evidence copy" if not data.run.get("evidence") else
                "the evidence copy is not a local directory with SHA256SUMS: the report "
                "stays in the run directory")
        return ReportFiles(target, picture, None, note)
    add_to_evidence(Path(dest), REPORT, html)
    return ReportFiles(target, picture, dest)


def _picture(data: ReportData, run_dir: Path) -> Path | None:
    from bot.messages.plots import summary_png

    bars = stage_bars(data.stages)
    if not bars:
        return None
    path = run_dir / PICTURE
    _atomic(path, summary_png(bars, data.item_times))
    return path


def add_to_evidence(dest: Path, rel: str, data: bytes) -> None:
    """Put ``rel`` into the evidence copy and its line into SHA256SUMS (replacing an old one)."""
    _atomic(dest / rel, data)
    sums = dest / SUMS
    try:
        lines = [ln for ln in sums.read_text(encoding="utf-8").splitlines(keepends=True)
                 if ln[66:].rstrip("\n") != rel]
    except OSError as exc:
        raise ReportError(f"{sums}: cannot read: {exc}") from exc
    lines.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    _atomic(sums, "".join(lines).encode("utf-8"))


def _atomic(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise ReportError(f"cannot write {path}: {exc}") from exc
