"""Writes ``report.html`` (and the Slack picture) for a run, into its run directory and
its evidence copy.

The page itself is ``bot.messages.report.render_report`` (pure); this module gathers what
it shows from the store and the disk, and writes the files atomically. In the evidence copy
the report is added to ``SHA256SUMS`` (its line replaced on a rewrite), so
``preflight verify`` still accepts the copy.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import stat
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot.errors import PreflightError
from bot.messages.report import REPORT_ROWS, ReportData, render_report, stage_bars
from bot.pilot.clock import read_time
from bot.store import Run, RunRecord, Store
from runner.evidence import INDEX, SUMS, file_sha256, is_url, join_dest, parse_index_line
from runner.files import write_bytes_atomic

REPORT = "report.html"
PICTURE = "report-summary.png"
MAX_CHECKSUMS = REPORT_ROWS  # the run directory's files hashed for a report without a copy
ENGINE_NOTES = 200  # the volume engine's notes a report shows (the last ones)

log = logging.getLogger(__name__)


class ReportError(PreflightError):
    """The report cannot be written (names the path)."""


@dataclass(frozen=True)
class ReportFiles:
    html: Path
    picture: Path | None
    evidence_copy: str | None  # where the copy was updated, or None
    note: str = ""  # why the evidence copy was not updated, when it was not


def gather(store: Store, run_id: str, run: Run | None = None) -> ReportData:
    """What the report shows; ``run``: the run as the caller's step read it (else read
    here)."""
    run = run if run is not None else store.run(run_id)
    stages = store.stages(run_id)
    starts = [t for t in (read_time(s.get("started_at")) for s in stages) if t is not None]
    zero = min(starts) if starts else None
    times: list[float] = []
    points: list[tuple[float, float]] = []
    outcomes = store.item_outcomes(run_id)
    for item in outcomes:
        when = read_time(item.ts)
        if zero is not None and when is not None:
            times.append((when - zero).total_seconds())
        seconds, size = item.elapsed_s, item.input_bytes
        if item.status == "accepted" and isinstance(seconds, (int, float)) \
                and isinstance(size, int):
            points.append((float(size), float(seconds)))
    sums, source, total, rest = _checksums(run)
    parent = store.run(run.parent_run) if run.parent_run else None
    volume = run.kind == "volume"
    return ReportData(run=run, stages=stages, decisions=store.decisions(run_id),
                      generated_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                      item_times=times, item_points=points, checksums=sums,
                      checksums_from=source, checksums_total=total, checksums_rest=rest,
                      parent_forecast=parent.forecast if parent else None,
                      launched_by=_launched_by(store, parent) if parent else None,
                      volume_run=None if volume else store.volume_of(run_id),
                      engine=_engine(store, run, stages, len(outcomes)) if volume else None)


def _launched_by(store: Store, parent: Run) -> dict[str, Any]:
    """The pilot whose approval launched a volume run, and that approval."""
    accepted = [d for d in store.decisions(parent.id) if d.get("accepted")]
    return {"pilot": parent.id, "name": parent.name,
            "decision": accepted[-1] if accepted else None}


def _engine(store: Store, run: Run, stages: list[dict[str, Any]],
            items: int) -> dict[str, Any]:
    """A volume's workers, pace and attempts (started, stopped, resumed) from its events."""
    from bot.service.forecast_inputs import ATTEMPT_EVENTS, attempt_seconds, work_seconds

    # the work stage's own time in each attempt, added: the items recorded over every
    # attempt are divided by it (the last attempt's alone gave a resumed run's pace wrong)
    spans = attempt_seconds(sorted((e for etype in ATTEMPT_EVENTS
                                    for e in store.events_of_type(run.id, etype)),
                                   key=lambda e: e.seq))
    workers = store.events_of_type(run.id, "volume.workers")
    attempts = [{"at": e.ts, "resume": bool(e.data.get("resume"))}
                for e in store.events_of_type(run.id, "run.started")]
    stops = [{"at": e.ts, "stage": e.data.get("stage")}
             for e in store.events_of_type(run.id, "stage.failed")
             if (e.data.get("error") or {}).get("type") == "Interrupted"]
    return {"workers": list(workers[-1].data.get("workers") or []) if workers else [],
            "items": items, "notes": engine_notes(store, run.id),
            "work_s": sum(spans) if spans else work_seconds(stages),
            "work_attempts": max(1, len(spans)), "attempts": attempts, "stops": stops,
            "stop": run.stop}  # a StopNote (or None)


def engine_notes(store: Store, run_id: str) -> dict[str, Any]:
    """What the terminal's Volume engine message told (workers excluded or lost, batches
    split or re-queued, inputs refused alone, cards excluded), in order: the last
    ``ENGINE_NOTES`` of them and how many there were."""
    from bot.messages.volume_view import NOTE_TYPES, note

    events = sorted((e for etype in NOTE_TYPES if etype != "volume.workers"
                     for e in store.events_of_type(run_id, etype)), key=lambda e: e.seq)
    texts = [(e.ts, n.text, n.style) for e in events for n in [note(e)] if n is not None]
    return {"total": len(texts), "shown": texts[-ENGINE_NOTES:]}


def _checksums(run: Run) -> tuple[list[tuple[str, str]], str, int, str]:
    """The first ``REPORT_ROWS`` checksums the report shows, where they come from, how
    many there are in all and where the rest are listed."""
    dest = _local_evidence(run)
    if dest is not None:
        sums = Path(dest) / SUMS
        index = Path(dest) / INDEX
        try:
            pairs, total = first_sums(sums)
            if _regular(index):  # outputs in shards: each listed by the index
                more, count = first_outputs(index, REPORT_ROWS - len(pairs))
                return (pairs + more, f"{SUMS} (files and shards) and {INDEX} (the outputs "
                        f"in the shards) of the evidence copy at {dest}", total + count,
                        f"{SUMS} and {INDEX} in the evidence copy {dest}")
        except (OSError, UnicodeDecodeError) as exc:
            return [], f"the evidence copy's {SUMS} cannot be read: {exc}", 0, ""
        return (pairs, f"{SUMS} of the evidence copy at {dest} (the report adds its own line)",
                total, f"{SUMS} in the evidence copy {sums}")
    run_dir = run.run_dir
    pairs, total = [], 0
    for path in sorted(p for p in run_dir.rglob("*") if _regular(p)):
        rel = path.relative_to(run_dir).as_posix()
        if rel in (REPORT, PICTURE) or rel.startswith(("ledger.sqlite", "runner.", ".")):
            continue
        total += 1
        if len(pairs) >= MAX_CHECKSUMS:
            continue
        try:
            pairs.append((file_sha256(str(path)), rel))
        except OSError:
            total -= 1
    return pairs, (f"computed over the run directory {run_dir} (no local evidence copy; "
                   "the ledger, which changes on resume, is left out)"), total, \
        f"the run directory {run_dir} (no evidence copy: the other files were not hashed)"


def first_sums(sums: Path) -> tuple[list[tuple[str, str]], int]:
    """The first ``REPORT_ROWS`` lines of a SHA256SUMS (the report's own left out) and how
    many lines it has: read line by line, never whole (a million outputs: ~100 MB)."""
    pairs: list[tuple[str, str]] = []
    total = 0
    for text in _lines(sums):
        line = text.rstrip("\n")
        if len(line) <= 66 or line[66:] == REPORT:
            continue
        total += 1
        if len(pairs) < REPORT_ROWS:
            pairs.append((line[:64], line[66:]))
    return pairs, total


def _lines(path: Path) -> Iterator[str]:
    """The lines of a regular file of the evidence, one at a time (never through a link,
    never a FIFO's wait)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{path}: not a regular file")
        for raw in fh:
            yield raw.decode("utf-8")


def first_outputs(index: Path, rows: int) -> tuple[list[tuple[str, str]], int]:
    """The first ``rows`` outputs of a shard index as (sha256, path) and how many it
    lists: read line by line (a million outputs: ~140 MB)."""
    pairs: list[tuple[str, str]] = []
    total = 0
    for line in _lines(index):
        entry = parse_index_line(line)
        if entry is None:
            continue  # the header (`preflight verify` names any other bad line)
        total += 1
        if len(pairs) < rows:
            pairs.append((entry[3], entry[0]))
    return pairs, total


def _local_evidence(run: Run) -> str | None:
    """The run's local evidence copy, only where the bot itself put it (``evidence_home``):
    a ``dest`` the node claimed elsewhere is never written to."""
    dest = (run.evidence.dest if run.evidence is not None else None) or ""
    if not dest or is_url(dest) or not os.path.isabs(dest) or dest != evidence_home(run):
        return None
    return dest if _regular(Path(dest) / SUMS) else None


def evidence_home(run: RunRecord) -> str | None:
    """Where the run's evidence copy belongs, as the bot decided it: ``results.copy_to`` of
    the bot's own spec (resolved when the run was built) joined with the run id; None
    without a copy_to or a readable spec. What a node says (an ``evidence`` event's
    ``dest``) is only a claim, compared with this (``settle_evidence``)."""
    try:
        spec = json.loads(Path(str(run.spec_path or "")).read_text(encoding="utf-8"))
        copy_to = str(((spec.get("results") or {}).get("copy_to")) or "")
    except (OSError, ValueError, AttributeError):
        return None
    if not copy_to:
        return None
    if is_url(copy_to):
        return join_dest(copy_to, run.id)
    return os.path.normpath(join_dest(str(Path(copy_to.removeprefix("file://")).resolve()),
                                      run.id))


def settle_evidence(run: RunRecord, evidence: dict[str, Any] | None,
                    fetched: Path | None) -> dict[str, Any] | None:
    """The run's evidence record with a ``dest`` the bot decided, never the node's word.

    ``fetched``: the copy an SSH fetch brought back (the bot chose where). Otherwise the
    runner's ``dest`` must be ``evidence_home``; any other place is refused: the record
    keeps the bot's place, the claim as ``node_dest``, ``verified`` false and why. A URL
    copy made from an SSH node was checked by the node alone: ``verified_by: node`` says
    that its ``verified`` is the node's claim (the verdict says so)."""
    if not evidence:
        return evidence
    claimed = evidence.get("dest")
    if fetched is not None:
        return {**evidence, "dest": str(fetched), "node_dest": claimed}
    home = evidence_home(run)
    if run.remote and not (
            home is not None and is_url(home)):
        # the node's copy was not brought back: its path on the node is all there is, and
        # it is never a place on the bot host
        return {**evidence, "dest": None, "node_dest": claimed, "verified": False}
    if isinstance(claimed, str) and home is not None and (
            claimed == home or (not is_url(claimed) and os.path.normpath(claimed) == home)):
        if run.remote:  # a URL the node copied to and checked: its word only
            return {**evidence, "dest": home, "verified_by": "node"}
        return {**evidence, "dest": home}
    if home is None:  # no results.copy_to: no evidence is expected, none is written
        why = (f"the runner said it copied the evidence to {claimed!r}, but the manifest "
               "names no results.copy_to: nothing is written there")
        log.warning("run %s: %s", run.id, why)
        return {**evidence, "dest": None, "node_dest": claimed, "dest_refused": why}
    why = (f"the runner said it copied the evidence to {claimed!r}, not to {home!r} where "
           "the bot sent it (results.copy_to / run id): the claim is refused and nothing "
           "is written there")
    log.warning("run %s: %s", run.id, why)
    return {**evidence, "dest": home, "node_dest": claimed, "verified": False,
            "dest_refused": why}


def _regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def _read_text_nofollow(path: Path) -> str:
    """The text of a regular file, never through a link (``O_NOFOLLOW``)."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        if not stat.S_ISREG(os.fstat(fh.fileno()).st_mode):
            raise OSError(f"{path}: not a regular file")
        return fh.read().decode("utf-8")


def write_report(store: Store, run_id: str, run: Run | None = None) -> ReportFiles:
    """Write (or rewrite) the run's report.html and summary picture; update the evidence.
    Refused for a run whose item rows retention pruned: the report written at its end
    stays, rather than one without its items. ``run``: the run as the caller's step read
    it (else read here, once)."""
    run = run if run is not None else store.run(run_id)
    pruned = run.items_pruned_at
    if pruned:
        raise PreflightError(
            f"run {run_id}: its item rows were pruned from the state database on "
            f"{pruned[:10]} (retention): a report written now would lack them; the one "
            f"written when it ended is {run.run_dir / REPORT}")
    data = gather(store, run_id, run)
    run_dir = run.run_dir
    html = render_report(data).encode("utf-8")
    target = run_dir / REPORT
    _atomic(target, html)
    picture = _picture(data, run_dir)
    dest = _local_evidence(run)
    if dest is None:
        note = ("no evidence copy" if not run.evidence else
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
        lines = [ln for ln in _read_text_nofollow(sums).splitlines(keepends=True)
                 if ln[66:].rstrip("\n") != rel]
    except (OSError, UnicodeDecodeError) as exc:
        raise ReportError(f"{sums}: cannot read: {exc}") from exc
    lines.append(f"{hashlib.sha256(data).hexdigest()}  {rel}\n")
    _atomic(sums, "".join(lines).encode("utf-8"))


def _atomic(path: Path, data: bytes) -> None:
    """Temporary file + rename (``runner.files``): never written through a link."""
    try:
        write_bytes_atomic(path, data)
    except OSError as exc:
        raise ReportError(f"cannot write {path}: {exc}") from exc
