"""Outputs lost with their node: a several-node volume's inputs run again, not counted done.

A worker's shard lives on its node until the ``collect`` stage brings it to the head
(``runner/volume_collect.py``). A node whose disk was wiped or replaced before that takes
those outputs with it, while the ledger still counts their inputs accepted. A shard is
lost when the node that wrote it (its worker's place in the shard record: the manifest's
name of the node, else its host name) answered the collection's listing without refusing
anything, and neither it, nor any other node, nor the head holds the shard as recorded.
Its inputs are then forgotten, so the balance names them missing and ``preflight resume
RUN`` runs them again. A node that did not answer (its Ray gone, its machine down) is not
lost: nothing of it is forgotten (its files may come back with it), the stage fails
naming the shard, and a resume asks again. Only shards are forgotten: their names carry
the attempt and the worker, so a run again never writes one of the same name (a handler's
own file, which a run again writes under the same name, stays a failure of the stage).

In that order, each step repeatable (a runner killed between two finds the rest undone
and does it again):

1. one line per shard in ``lost_outputs.jsonl`` (the shard, why, when), flushed to disk;
2. the ledger rows whose output is a line of a lost shard move to its ``forgotten`` table,
   in one transaction (``Ledger.forget_shards``: the row is kept there, not deleted);
3. the shard record (``node_shards.jsonl``) rewritten without the lost shards, so the next
   collection does not look for them;
4. a head copy that differs from its record moved to ``lost/`` (kept to look at, out of the
   outputs the evidence packs); every collection first moves aside any shard of
   ``lost_outputs.jsonl`` still in ``outputs/`` (a runner killed before step 4).

A shard found lost that comes back with its node is left there: never collected beside
the outputs that replaced it (``lost_files``).
"""

from __future__ import annotations

import json
import os
import time
from typing import Dict, Iterable, Mapping, Set

from runner.files import atomic_open
from runner.ledger import Ledger, ledger_path
from runner.outputs import OUTPUTS, SHARDS, is_shard

LOST_LOG = "lost_outputs.jsonl"
LOST_DIR = "lost"


def forget_lost(run_dir: str, lost: Mapping[str, str], book_path: str) -> Dict[str, int]:
    """Forget the inputs whose output is in one of the ``lost`` shards (run-relative path
    -> why it is lost) in the steps of the module; returns the rows forgotten per shard."""
    lost = {path: why for path, why in lost.items() if is_shard(path)}
    if not lost:
        return {}
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    log = os.path.join(run_dir, LOST_LOG)
    with open(log, "a+b") as fh:  # appended at the end whatever is read
        torn = False
        if fh.seek(0, os.SEEK_END) > 0:  # a killed runner's torn last line ends first
            fh.seek(-1, os.SEEK_END)
            torn = fh.read(1) != b"\n"
        lines = "".join(json.dumps({"file": path, "why": why, "at": now}, sort_keys=True)
                        + "\n" for path, why in sorted(lost.items()))
        fh.write((("\n" if torn else "") + lines).encode("utf-8"))
        fh.flush()
        os.fsync(fh.fileno())
    per_file: Dict[str, int] = {}
    if os.path.exists(ledger_path(run_dir)):
        ledger = Ledger.open(ledger_path(run_dir))
        try:
            per_file = ledger.forget_shards(lost)
        finally:
            ledger.close()
    _drop_from_book(book_path, lost)
    set_aside(run_dir, lost)
    return per_file


def set_aside(run_dir: str, shards: Iterable[str]) -> None:
    """Each of ``shards`` still in the head's ``outputs/`` moved to ``lost/`` (never a path
    outside the run directory: each is a checked shard path)."""
    head = os.path.realpath(run_dir)
    for path in shards:
        if not is_shard(path):
            continue
        full = os.path.join(head, path)
        if os.path.lexists(full) and os.path.realpath(os.path.dirname(full)) == \
                os.path.join(head, OUTPUTS, SHARDS):
            aside = os.path.join(head, LOST_DIR, path)
            os.makedirs(os.path.dirname(aside), exist_ok=True)
            os.replace(full, aside)


def lost_files(run_dir: str) -> Set[str]:
    """The shards an earlier collection found lost (``lost_outputs.jsonl``): their inputs
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
            if isinstance(name, str) and is_shard(name):
                out.add(name)
    return out


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
