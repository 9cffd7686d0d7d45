"""A finished run's results brought back through its ``Node``, file by file: the
node-agnostic dispatcher's fetch (``node_dispatcher.py``).

- The node's run directory: every regular file its listing names (no link followed), the
  bot's own records never replaced (``fetched_name``) and a name leading out of it
  skipped, written under the run directory (a link on the way refuses the fetch); at most
  ``FETCH_MAX_FILES`` files and ``FETCH_MAX_BYTES`` bytes.
- With an evidence home on the bot host (``results.copy_to``, ``remote.json``'s
  ``evidence``): the node's evidence copy (``<remote>/<run id>``) is brought into a staging
  folder beside the home (``.fetch-<run id>``, every write held inside it by ``HostDir``),
  each name checked per component (``node_relpath``: refused, naming the node), each file
  compared with its ``SHA256SUMS`` line as it arrives (a file that differs
  refuses the fetch by name), and only a complete copy replaces the home, which is then
  verified (``verify_fetched``); the home is first held apart from the bot's own folders
  (``refuse_evidence_home``). A run that left no evidence copy (it died before its evidence
  stage) brings back its run directory only. A refusal removes the staging folder and
  replaces nothing.

The SSH kind's fetch (``bot/nodes/ssh/fetch.py``) streams instead, goes on from what
verified after a cut and meters the copy; this one reads each file whole, in memory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bot.dispatch.base import RunHandle
from bot.dispatch.bot_records import STAGING_PREFIX, fetched_name
from bot.dispatch.evidence_home import refuse_evidence_home
from bot.dispatch.host_tree import HostDir
from bot.dispatch.node_names import node_relpath
from bot.dispatch.upload import verify_fetched
from bot.errors import DispatchError
from bot.nodes.base import Node
from runner.evidence import SUMS, parse_sums
from runner.files import write_bytes_atomic

FETCH_MAX_FILES = 100_000  # files a fetch brings back from one folder of the node
FETCH_MAX_BYTES = 8 << 30  # bytes, all files of that folder together


def fetch_over_node(handle: RunHandle, node: Node, layout: dict[str, Any],
                    keep_out: Sequence[Path] = ()) -> Path | None:
    """The run directory back, then the evidence copy to its home when the run has one
    (``keep_out``: the bot's own folders no home may touch); the verified home, or None."""
    evidence = layout.get("evidence") or {}
    home = Path(evidence["local"]) / handle.run_id \
        if evidence.get("local") and evidence.get("remote") else None
    if home is not None:
        refuse_evidence_home(handle, home, keep_out)
    python = str(layout.get("python") or "python3")
    _fetch_run_dir(handle, node, layout["run_dir"], python)
    if home is None:
        return None
    src = f"{evidence['remote']}/{handle.run_id}"
    names = _listing(node, src, python)
    if not names:
        return None  # no evidence copy on the node: its run directory is what came back
    _fetch_evidence(handle, node, src, names, home)
    verify_fetched(handle, home)
    return home


def _fetch_run_dir(handle: RunHandle, node: Node, run_dir: str, python: str) -> None:
    total = 0
    for rel in _listing(node, run_dir, python):
        parts = rel.split("/")
        if not fetched_name(parts[0]) or rel.startswith("/") or ".." in parts:
            continue
        data = node.read_file(f"{run_dir}/{rel}")
        total += len(data)
        if total > FETCH_MAX_BYTES:
            raise DispatchError(f"run {handle.run_id}: {node.where}: the run directory "
                                f"is over {FETCH_MAX_BYTES} bytes; fetch stopped")
        dest = handle.run_dir.joinpath(*parts)
        _safe_parent(handle.run_dir, dest)
        write_bytes_atomic(dest, data)


def _fetch_evidence(handle: RunHandle, node: Node, src: str, names: list[str],
                    home: Path) -> None:
    """The evidence copy into a fresh staging folder beside ``home``, then in its place."""
    rels = [node_relpath(rel, node.where, src) for rel in names]
    sums = parse_sums(node.read_file(f"{src}/{SUMS}"))[0] if SUMS in rels else {}
    staging_name, total = f"{STAGING_PREFIX}-{handle.run_id}", 0
    home.parent.mkdir(parents=True, exist_ok=True)
    with HostDir(home.parent) as parent:
        try:
            with parent.fresh(staging_name) as staging:
                for rel in rels:
                    data = node.read_file(f"{src}/{rel}")
                    total += len(data)
                    if total > FETCH_MAX_BYTES:
                        raise DispatchError(f"run {handle.run_id}: {node.where}: the evidence "
                                            f"copy is over {FETCH_MAX_BYTES} bytes; fetch "
                                            "stopped and nothing was replaced")
                    listed = sums.get(rel)
                    if listed is not None and hashlib.sha256(data).hexdigest() != listed:
                        raise DispatchError(
                            f"run {handle.run_id}: the evidence copy's {rel!r} from "
                            f"{node.where} differs from its line in {SUMS}: the fetch is "
                            "refused and nothing was replaced on the bot host")
                    parts = rel.split("/")
                    for depth in range(1, len(parts)):
                        staging.ensure_dir(parts[:depth])
                    with os.fdopen(staging.create(parts), "wb") as fh:
                        fh.write(data)
            parent.replace_into(staging_name, parent, home.name)
        except BaseException:
            parent.remove(staging_name)
            raise


LISTING = ("import json, os, sys\nroot = sys.argv[1]\nout = []\n"
           "for base, dirs, names in os.walk(root):\n"
           "    dirs[:] = [d for d in dirs if not os.path.islink(os.path.join(base, d))]\n"
           "    for name in names:\n"
           "        path = os.path.join(base, name)\n"
           "        if os.path.isfile(path) and not os.path.islink(path):\n"
           "            out.append(os.path.relpath(path, root))\n"
           "print(json.dumps(out))\n")


def _listing(node: Node, folder: str, python: str) -> list[str]:
    """The regular files under the node's ``folder`` (no link followed), relative; [] when
    there is no such folder."""
    code, out, err = node.run(" ".join(shlex.quote(a) for a in
                                       (python, "-c", LISTING, folder)), timeout=300)
    try:
        names = json.loads(out) if code == 0 else None
    except ValueError:
        names = None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise DispatchError(f"{node.where}: cannot list {folder} ({err.strip()[:200]!r})")
    if len(names) > FETCH_MAX_FILES:
        raise DispatchError(f"{node.where}: {folder} holds over {FETCH_MAX_FILES} files")
    return sorted(names)


def _safe_parent(root: Path, dest: Path) -> None:
    """Make ``dest``'s folders under ``root``, refusing a link on the way (a node's name
    never leads out of the run directory)."""
    here = root
    for part in dest.relative_to(root).parts[:-1]:
        here = here / part
        if here.is_symlink():
            raise DispatchError(f"{here}: a link in the run directory; fetch refused")
        here.mkdir(exist_ok=True)
