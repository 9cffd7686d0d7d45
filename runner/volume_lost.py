"""Outputs lost with their node: a several-node volume's inputs run again, not counted done.

A worker's shard lives on its node until the ``collect`` stage brings it to the head
(``runner/volume_collect.py``). A node lost before that (its machine gone, its disk
wiped) takes those outputs with it, while the ledger still counts their inputs accepted.
When every node of the cluster answered its listing and a file the ledger or the shard
record names is on none of them, nor on the head as recorded, the file is lost: its
inputs are forgotten, so the balance names them missing and ``preflight resume RUN`` runs
them again on the nodes left. In that order, each step repeatable (a runner killed
between two finds the rest undone and does it again):

1. one line per file in ``lost_outputs.jsonl`` (the file, why, when), flushed to disk;
2. the ledger rows whose output is in a lost file move to its ``forgotten`` table, in one
   transaction (``Ledger.forget_outputs``: the row is kept there, not deleted);
3. the shard record (``node_shards.jsonl``) rewritten without the lost shards, so the next
   collection does not look for them;
4. a head copy that differs from its record moved to ``lost/`` (kept to look at, out of the
   outputs the evidence packs).

A node that did not answer is not lost: nothing is forgotten while one is silent (its files
may come back), the stage fails naming it, and a resume asks again. A node that comes back
after its files were found lost keeps them: they are not collected (``lost_files``), their
inputs having been run again.
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Mapping, Optional, Set

from runner.files import atomic_open
from runner.ledger import Ledger, ledger_path
from runner.outputs import file_of

LOST_LOG = "lost_outputs.jsonl"
LOST_DIR = "lost"


def forget_lost(run_dir: str, lost: Mapping[str, str], book_path: str) -> Dict[str, int]:
    """Forget the inputs whose output is in one of ``lost`` (run-relative file -> why it
    is lost) in the steps of the module; returns the rows forgotten per file."""
    if not lost:
        return {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    with open(os.path.join(run_dir, LOST_LOG), "a", encoding="utf-8") as fh:
        fh.write("".join(json.dumps({"file": path, "why": why, "at": now}, sort_keys=True)
                         + "\n" for path, why in sorted(lost.items())))
        fh.flush()
        os.fsync(fh.fileno())
    per_file: Dict[str, int] = {}
    if os.path.exists(ledger_path(run_dir)):
        ledger = Ledger.open(ledger_path(run_dir))
        try:
            per_file = ledger.forget_outputs(lambda output: _lost_file(output, lost), lost)
        finally:
            ledger.close()
    _drop_from_book(book_path, lost)
    head = os.path.realpath(run_dir)
    for path in lost:
        full = os.path.join(head, path)
        if os.path.lexists(full):
            aside = os.path.join(head, LOST_DIR, path)
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            os.replace(full, aside)
    return per_file


def lost_files(run_dir: str) -> Set[str]:
    """The files an earlier collection found lost (``lost_outputs.jsonl``): their inputs
    were forgotten, so a copy that comes back with its node is left there, never collected
    beside the outputs that replaced it (a torn line skipped)."""
    out: Set[str] = set()
    try:
        fh = open(os.path.join(run_dir, LOST_LOG), encoding="utf-8")
    except FileNotFoundError:
        return out
    with fh:
        for raw in fh:
            try:
                name = json.loads(raw).get("file")
            except (ValueError, AttributeError):
                continue
            if isinstance(name, str):
                out.add(name)
    return out


def _lost_file(output: str, lost: Mapping[str, str]) -> Optional[str]:
    name = file_of(output)
    return name if name in lost else None


def _drop_from_book(book_path: str, lost: Mapping[str, str]) -> None:
    """``node_shards.jsonl`` without the lines of the lost shards (a torn line kept as
    it was: the reader skips it)."""
    try:
        with open(book_path, encoding="utf-8") as fh:
            lines = fh.readlines()
    except FileNotFoundError:
        return
    kept = []
    for raw in lines:
        try:
            shard = json.loads(raw).get("shard")
        except (ValueError, AttributeError):
            shard = None
        if shard not in lost:
            kept.append(raw)
    if len(kept) != len(lines):
        with atomic_open(book_path) as out:
            out.write("".join(kept))

