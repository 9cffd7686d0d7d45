"""Where a run's outputs lie and one input's output, found by its id (`preflight outputs`).

A volume's workers write the outputs the handler returns into one JSONL shard per batch on
their own node (runner/outputs.py); each input's recorded outcome names its line
(``outputs/shards/<attempt>-<worker>-<seq>.jsonl#<line>``), a file the handler wrote names
its path (``outputs/<name>``), and a pilot's output is a file of its own
(``outputs/<id>.json``). The outcome is read from the store's items (the runner's
``item.done`` events), else from the run directory's ``balance.csv``; the output itself
from the run directory on this host (the runner's own, or the copy fetched from its node).
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bot.errors import ItemNotFound, PreflightError
from bot.pilot.record import Run
from bot.store import Store
from runner.errors import RunnerError
from runner.outputs import file_of, parse_ref, read_output, summary


@dataclass(frozen=True)
class OutputsPlace:
    """Where a run's outputs lie on this host, and what is there."""

    run: Run
    folder: Path
    shards: int
    shard_bytes: int
    files: int
    file_bytes: int
    on_nodes: list[str]  # listings of outputs kept on their nodes (relative paths)


@dataclass(frozen=True)
class ItemOutput:
    """One input's outcome and where its output lies: ``output`` is the output itself
    (a shard's line), ``file`` a file's path on this host, ``note`` what else to know."""

    item_id: str
    status: str
    reference: str | None
    file: Path | None = None
    line: int | None = None
    output: Any = None
    found: bool = False
    note: str = ""


def outputs_place(run: Run) -> OutputsPlace:
    found = summary(str(run.run_dir))
    return OutputsPlace(run, Path(found["dir"]), found["shards"], found["shard_bytes"],
                        found["files"], found["file_bytes"], list(found["on_nodes"]))


def item_output(store: Store, run: Run, item_id: str) -> ItemOutput:
    """Input ``item_id``'s outcome in ``run`` and its output; ItemNotFound when the run
    recorded no such input."""
    outcome = store.item_output(run.id, item_id) or _from_balance(run.run_dir, item_id)
    if outcome is None:
        raise ItemNotFound(f"run {run.id} recorded no input {item_id!r} (neither its events "
                           f"nor {run.run_dir / 'balance.csv'} name it)")
    status, reference = outcome
    if not reference:
        why = "it was refused" if status == "refused" else "its handler returned none"
        return ItemOutput(item_id, status, None, note=f"no output: {why}")
    shard = parse_ref(reference)
    path = run.run_dir / file_of(reference)
    if shard is None:
        return ItemOutput(item_id, status, reference, file=path, found=path.is_file(),
                          note="" if path.is_file() else _elsewhere(run, file_of(reference)))
    if not path.is_file():
        return ItemOutput(item_id, status, reference, file=path, line=shard.line,
                          note=_elsewhere(run, shard.path))
    try:
        output = read_output(str(run.run_dir), reference, item_id)
    except RunnerError as exc:
        raise PreflightError(f"run {run.id}, input {item_id!r}: {exc}") from exc
    return ItemOutput(item_id, status, reference, file=path, line=shard.line, output=output,
                      found=True)


def _from_balance(run_dir: Path, item_id: str) -> tuple[str, str | None] | None:
    """The input's row of ``balance.csv``, read line by line (a million rows)."""
    try:
        with open(run_dir / "balance.csv", encoding="utf-8", newline="") as fh:
            for row in csv.DictReader(fh):
                if row.get("id") == item_id:
                    return str(row.get("status") or ""), row.get("output") or None
    except OSError:
        return None
    return None


def _elsewhere(run: Run, rel: str) -> str:
    """Where a file not on this host lies: a node's listing (``volume.outputs_on_nodes``)
    names it, else the results are still on the run's node."""
    for listing in sorted((run.run_dir / "outputs" / "on_nodes").glob("node-*.json")):
        try:
            doc = json.loads(listing.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        files = doc.get("files") if isinstance(doc, dict) else None
        inner = rel.split("/", 1)[1] if rel.startswith("outputs/") else rel
        if isinstance(files, dict) and inner in files:
            return (f"kept on its node: {doc.get('where')} ({doc.get('run_dir')}/{rel}), "
                    f"listed with its SHA-256 in {listing.relative_to(run.run_dir)}")
    dest = run.evidence.dest if run.evidence is not None else None
    if dest:  # an SSH run's fetch brings its evidence copy only, not the run directory
        return (f"{rel} is not in {run.run_dir} on this host; the run's evidence copy "
                f"{dest} holds its output: `preflight evidence show {run.id} ITEM`")
    return (f"{rel} is not in {run.run_dir} on this host: the run's results may not be "
            "fetched yet (`preflight fetch RUN`)")
