"""The ``collect`` stage: a several-node volume's outputs brought to the head after the
items, before the balance and the evidence.

Workers write each batch's outputs as a JSONL shard on their own node
(``runner/outputs.py``), and tell the driver each shard's size and SHA-256; the driver
keeps that record on the head (``ShardBook``: ``node_shards.jsonl``, written before the
ledger rows that name the shard). Once the items are done, this stage, on its own clock
(judged by progress, not the items' time limit), joins the cluster, starts one small
actor on every other node (``NodeOutputs``: pinned to its node, no CPU asked) and has
each list its node's ``outputs/`` (``runner/volume_outputs.py``'s ``node_listing``).
Each node is then one stream of bounded chunks, the nodes in parallel
(``runner/volume_stream.py``): a file already on the head that verifies is skipped, the
others are written under a temporary name and renamed only once their size and SHA-256
match the worker's record (a handler's own file: the node's listing). So a resume, or a
restarted runner, collects only what is missing.

Before a byte moves, the head's free disk (its run directory's file system) is checked
against the bytes every node's missing files announce: short of room, the stage fails
naming each node, the bytes it needs and the bytes free, and nothing is collected.
The stage fails, naming the node and the file, when a shard differs from its record, a
node passes its cap (``volume.collect_max_bytes``), a node does not answer, or a file the
ledger or the record names is on no node; what was collected stays, and ``preflight
resume RUN`` collects the rest. A shard on no node and not on the head as recorded, whose
own node answered without it, was lost by that node: its inputs are forgotten by the
ledger and a resume runs them again (``runner/volume_lost.py``). With
``volume.outputs_on_nodes`` the files stay on their nodes and only each node's listing is
written on the head.
"""

from __future__ import annotations

import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterable, List, Optional, Set, Tuple

from runner.ledger import Ledger, LedgerError, ledger_path
from runner.outputs import OUTPUTS, file_of, is_shard
from runner.spec import NODE_RUN_DIR_ENV, NODE_WHERE_ENV
from runner.stage import StageContext, StageFailure
from runner.volume_lost import LOST_LOG, forget_lost, lost_files, set_aside
from runner.volume_stream import Beat, NodeResult, Piece, Source, Want, plan, present, stream

BOOK = "node_shards.jsonl"
ANSWER_S = 600.0              # a node's listing or chunk must come within this
DEFAULT_CAP = 64 << 30        # bytes of outputs a node may send in a run
DISK_RESERVE = 1 << 30        # bytes the collection leaves free on the head (ledger, evidence)
PROBLEMS_SHOWN = 20
Listing = Dict[str, Any]


class ShardBook:
    """The head's record of the shards the workers wrote: one JSON line each
    (``shard``, ``bytes``, ``sha256``, ``worker``), appended by the driver's recording
    thread before the ledger rows that name the shard."""

    def __init__(self, run_dir: str) -> None:
        self.path = os.path.join(run_dir, BOOK)

    def add(self, worker: str, shards: Any, prefix: Optional[str] = None) -> None:
        """Append what a worker says it wrote (checked: a malformed entry is left out, and
        with ``prefix``, the worker's ``a<attempt>-w<key>``, a shard of another name: a
        worker cannot claim another's shard, whose honest copy would then look lost)."""
        lines = [json.dumps({"shard": s["shard"], "bytes": s["bytes"], "sha256": s["sha256"],
                             "worker": worker}, sort_keys=True) + "\n"
                 for s in (shards if isinstance(shards, list) else []) if _valid(s)
                 and (prefix is None or s["shard"].rsplit("/", 1)[-1].startswith(f"{prefix}-"))]
        if lines:
            with open(self.path, "a", encoding="utf-8") as fh:
                fh.write("".join(lines))

    def read(self) -> Dict[str, Tuple[int, str, str]]:
        """shard path -> (bytes, sha256, worker); the first line of a shard wins, a torn
        or malformed line (a killed driver's last) is skipped."""
        out: Dict[str, Tuple[int, str, str]] = {}
        try:
            fh = open(self.path, encoding="utf-8")
        except FileNotFoundError:
            return out
        with fh:
            for raw in fh:
                try:
                    doc = json.loads(raw)
                except ValueError:
                    continue
                if _valid(doc) and doc["shard"] not in out:
                    out[doc["shard"]] = (doc["bytes"], doc["sha256"], str(doc.get("worker")))
        return out


def _valid(s: Any) -> bool:
    return isinstance(s, dict) and isinstance(s.get("shard"), str) \
        and s["shard"].startswith(f"{OUTPUTS}/shards/") and ".." not in s["shard"].split("/") \
        and isinstance(s.get("bytes"), int) and not isinstance(s["bytes"], bool) \
        and s["bytes"] >= 0 and isinstance(s.get("sha256"), str) and len(s["sha256"]) == 64


class NodeOutputs:
    """On one node (a Ray actor pinned there): its ``outputs/`` listed, then read in
    pieces. Its node's run directory comes from the node's environment
    (``PREFLIGHT_NODE_RUN_DIR``, set by the dispatcher); without it the node shares the
    head's directory and has nothing to send."""

    def __init__(self) -> None:
        self.run_dir = os.environ.get(NODE_RUN_DIR_ENV) or None

    def listing(self) -> Listing:
        import socket

        from runner.volume_outputs import node_listing

        listing = node_listing(self.run_dir, max_total=1 << 62)  # the head applies the cap
        listing["where"] = os.environ.get(NODE_WHERE_ENV) \
            or f"{socket.gethostname()}:{self.run_dir}"
        # the node as its workers name it in the shard record (runner.volume_workers.Worker)
        listing["place"] = os.environ.get(NODE_WHERE_ENV) or socket.gethostname()
        return listing

    def read(self, pieces: List[Piece]) -> List[bytes]:
        from runner.volume_outputs import read_chunk

        return [read_chunk(self.run_dir, rel, int(offset), int(length))
                for rel, offset, length in pieces]


class RaySource:
    """A node's stream over Ray: each request one call of its ``NodeOutputs`` actor."""

    def __init__(self, ray: Any, actor: Any, where: str) -> None:
        self.ray, self.actor, self.where = ray, actor, where

    def send(self, pieces: List[Piece]) -> Any:
        return self.actor.read.remote(pieces)

    def take(self, token: Any) -> List[bytes]:
        return list(self.ray.get(token, timeout=ANSWER_S))


def disk_free(path: str) -> int:
    """Bytes an unprivileged writer may still write on the file system of ``path``."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def _room(head: str, plans: List[Tuple[List[Want], NodeResult]],
          free: Callable[[str], int]) -> bool:
    """Whether the head's run directory has room for every node's missing files (their
    sizes as the worker's record and the node's listing announce them) and
    ``DISK_RESERVE`` beside; if not, each node with files to send is refused, naming the
    bytes it needs and the bytes free, before a byte moves."""
    needed = sum(w.size for wants, _r in plans for w in wants)
    if needed == 0:
        return True
    have = free(head)
    if needed + DISK_RESERVE <= have:
        return True
    for wants, result in plans:
        if wants:
            result.refuse({w.rel for w in wants}, (
                f"{result.where}: {sum(w.size for w in wants):,} bytes of outputs to collect "
                f"({len(wants):,} file(s)), but the head's run directory {head} has "
                f"{have:,} bytes free for the {needed:,} bytes of every node "
                f"(+ {DISK_RESERVE:,} kept free): nothing collected"))
    return False


def collect_nodes(run_dir: str, nodes: List[Tuple[Source, Listing]], *, cap: int,
                  beat: Beat, keep_on_nodes: bool = False,
                  free: Callable[[str], int] = disk_free,
                  answered: Iterable[str] = ()) -> Dict[str, Any]:
    """Bring every node's outputs listed in ``nodes`` (a source and its listing) into
    ``run_dir/outputs``, the nodes in parallel, once the head is found to have room for
    them (``free``: its free bytes); then check every file the ledger or the record names
    is on the head. A shard on no node and not on the head as recorded, whose writer's
    node answered (its place among the listings without a refusal, or in ``answered``:
    the nodes sharing the head's directory), is lost: its inputs are forgotten
    (``runner/volume_lost.py``), one problem says how many. Returns the facts;
    ``problems`` lists what failed, each naming the node and the file (the stage fails on
    any)."""
    began = time.monotonic()
    book = ShardBook(run_dir).read()
    recorded = {path: (size, sha) for path, (size, sha, _w) in book.items()}
    head = os.path.realpath(run_dir)
    top = os.path.join(head, OUTPUTS)
    problems: List[str] = []
    listed: Set[str] = set()
    named: Set[str] = set()  # files a problem already accounts for
    if keep_on_nodes:
        from runner.volume_outputs import record_outputs

        kept = record_outputs(run_dir, [listing for _s, listing in nodes])
        return {**kept, "seconds": round(time.monotonic() - began, 3), "problems": []}
    jobs: List[Tuple[Source, Dict[str, Any]]] = []
    found_lost = lost_files(run_dir)
    set_aside(run_dir, found_lost)  # one a killed runner left in outputs/
    gone = {path.removeprefix(f"{OUTPUTS}/") for path in found_lost}
    places = set(answered) | {str(listing.get("place")) for _s, listing in nodes
                              if listing.get("place") and not listing.get("refused")}
    for source, listing in nodes:
        files: Dict[str, Any] = listing["files"] if isinstance(listing.get("files"), dict) \
            else {}
        files = {rel: v for rel, v in files.items() if rel not in gone}  # run again since
        listed |= {f"{OUTPUTS}/{rel}" for rel in files}
        if listing.get("refused"):  # a link or a special file: none of this node's taken
            problems += [f"{source.where}: {why}; none of its outputs collected"
                         for why in list(listing["refused"])[:5]]
            named |= {f"{OUTPUTS}/{rel}" for rel in files}
            continue
        jobs.append((source, files))

    def planned(n: int) -> Tuple[List[Want], NodeResult]:  # the head's copies checked
        source, files = jobs[n]
        return plan(top, source.where, files, recorded, cap, beat)

    def one(n: int) -> NodeResult:
        wants, result = plans[n]
        return stream(jobs[n][0], top, wants, result, beat, tag=f"c{n}")

    with ThreadPoolExecutor(max_workers=max(1, min(len(jobs), 16))) as pool:
        plans = list(pool.map(planned, range(len(jobs))))
        if _room(head, plans, free):
            done = list(pool.map(one, range(len(jobs))))
        else:
            done = [result for _w, result in plans]
    for result in done:
        problems += result.problems
        named |= {f"{OUTPUTS}/{rel}" for rel in result.named}
    verified = {f"{OUTPUTS}/{rel}" for r in done for rel in r.verified}
    lost: Dict[str, str] = {}
    for path, why, nowhere in _missing(run_dir, head, book, listed | verified, verified, beat):
        if path in named:
            continue
        writer = _place(book[path][2]) if path in book else None
        if nowhere and writer is not None and is_shard(path):
            if writer in places:
                lost[path] = why
                continue
            why += f" (its node {writer} did not answer: nothing forgotten)"
        problems.append(why)
    forgotten = _forget(run_dir, lost, problems)
    facts: Dict[str, Any] = {
        "nodes": len(nodes), "files": sum(r.files for r in done),
        "bytes": sum(r.bytes for r in done),
        "present_files": sum(r.present_files for r in done),
        "present_bytes": sum(r.present_bytes for r in done),
        "recorded_shards": len(book), "cap_bytes": cap,
        "lost_files": len(lost), "forgotten_inputs": forgotten,
        "seconds": round(time.monotonic() - began, 3),
        "per_node": [r.facts() for r in done][:PROBLEMS_SHOWN],
        "problems": problems[:PROBLEMS_SHOWN], "problems_total": len(problems)}
    return facts


def _place(worker: str) -> str:
    """The node of a shard record's worker label (``w3@gpu-2[0,1]``: ``gpu-2``)."""
    place = worker.split("@", 1)[-1]
    return place.rpartition("[")[0] if place.endswith("]") and "[" in place else place


def _forget(run_dir: str, lost: Dict[str, str], problems: List[str]) -> int:
    """The inputs whose outputs are in ``lost`` forgotten (``runner/volume_lost.py``), said
    in one problem; returns how many."""
    if not lost:
        return 0
    per_file = forget_lost(run_dir, lost, os.path.join(run_dir, BOOK))
    count = sum(per_file.values())
    if count:
        first = min(per_file)
        more = f" and {len(per_file) - 1:,} more" if len(per_file) > 1 else ""
        problems.append(
            f"{count:,} input(s) forgotten by the ledger, their outputs lost by the node "
            f"that wrote them: {lost[first]}{more} ({LOST_LOG}); `preflight resume RUN` "
            f"runs them again")
    return count


def _missing(run_dir: str, head: str, book: Dict[str, Tuple[int, str, str]],
             listed: Set[str], verified: Set[str],
             beat: Beat) -> List[Tuple[str, str, bool]]:
    """The files the record or the ledger names that the head lacks (a shard: or holds
    with other content than recorded), ``verified`` ones aside: (path, why, on no node)."""
    expected: Dict[str, str] = {path: f"written by worker {w}"
                                for path, (_s, _h, w) in book.items()}
    for path in _ledger_files(run_dir):
        expected.setdefault(path, "named by the ledger")
    out: List[Tuple[str, str, bool]] = []
    for n, (path, whence) in enumerate(sorted(expected.items())):
        if path in verified:
            continue
        if n % 1000 == 0:
            beat(f"collect: checking the head's outputs ({n} of {len(expected)})")
        full = os.path.join(head, path)
        record = book.get(path)
        if record is not None:
            ok = present(full, Want(path, record[0], record[1]))
        else:
            ok = os.path.isfile(full) and not os.path.islink(full)
        if ok:
            continue
        where = "listed by a node but not collected" if path in listed else \
            "on no node of the cluster"
        state = "differs from its record on the head" if os.path.lexists(full) else \
            "missing on the head"
        out.append((path, f"{path} ({whence}): {state}, {where}", path not in listed))
    return out


def _ledger_files(run_dir: str) -> Set[str]:
    """The output files (a shard, or a handler's own file) the ledger's rows name."""
    path = ledger_path(run_dir)
    if not os.path.exists(path):
        return set()
    try:
        ledger = Ledger.open(path)
    except LedgerError as exc:
        raise StageFailure("collect", str(exc), hint="check the run directory") from exc
    try:
        out = set()
        for row in ledger.rows():
            if row.status == "accepted" and row.output:
                name = file_of(row.output)
                if name.startswith(f"{OUTPUTS}/") and ".." not in name.split("/"):
                    out.add(name)
        return out
    finally:
        ledger.close()


def collect(ctx: StageContext) -> Dict[str, Any]:
    """The ``collect`` stage: every other node's outputs to the head (see the module)."""
    from runner import volume_ray

    vspec = ctx.spec.volume
    if vspec is None:
        raise StageFailure("collect", "the spec has no volume section")
    volume_ray.prepare_env(vspec)
    ray = volume_ray.import_ray("collect")
    volume_ray.start(ray, vspec, ctx.run_dir, 1, stage="collect")
    actors: List[Any] = []
    try:
        ctx.beat("collect: listing the nodes' outputs")
        nodes, shared, problems = _node_sources(ray, ctx.run_dir, actors)
        cap = int(vspec.collect_max_bytes or DEFAULT_CAP)
        facts = collect_nodes(ctx.run_dir, nodes, cap=cap, beat=ctx.beat,
                              keep_on_nodes=bool(vspec.outputs_on_nodes), answered=shared)
    finally:
        volume_ray.stop(ray, actors, ctx.run_dir)
    problems += facts.get("problems") or []
    if problems:
        more = f" (and {len(problems) - 1} more: the stage's facts)" if len(problems) > 1 else ""
        facts["problems"] = problems[:PROBLEMS_SHOWN]
        raise StageFailure("collect", f"the outputs of the other nodes were not all "
                           f"collected: {problems[0]}{more}",
                           hint="what was collected is kept; `preflight resume RUN` "
                                "collects the rest once the node answers (a refused file "
                                "stays on its node: look at it there)", facts=facts)
    return facts


def _node_sources(ray: Any, run_dir: str, actors: List[Any],
                  ) -> Tuple[List[Tuple[Source, Listing]], Set[str], List[str]]:
    """One ``NodeOutputs`` actor on every live node, and its listing (the head, or a node
    sharing the head's run directory, left out: its place kept, it answered); the nodes
    that did not answer, named."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    cls = ray.remote(num_cpus=0, max_restarts=0, max_task_retries=0)(NodeOutputs)
    started: List[Tuple[Any, str]] = []
    for node in ray.nodes():
        if node.get("Alive"):
            strategy = NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
            actor = cls.options(scheduling_strategy=strategy).remote()
            actors.append(actor)
            started.append((actor, str(node.get("NodeManagerAddress") or node["NodeID"][:8])))
    refs = [actor.listing.remote() for actor, _a in started]
    head = os.path.realpath(run_dir)
    out: List[Tuple[Source, Listing]] = []
    shared: Set[str] = set()
    problems: List[str] = []
    for (actor, address), ref in zip(started, refs):
        try:
            listing = ray.get(ref, timeout=ANSWER_S)
        except Exception as exc:
            problems.append(f"node {address}: its outputs could not be listed: "
                            f"{type(exc).__name__}: {str(exc)[:300]}")
            continue
        node_dir: Optional[str] = listing.get("run_dir") if isinstance(listing, dict) else None
        if not node_dir or os.path.realpath(str(node_dir)) == head:
            if isinstance(listing, dict) and listing.get("place"):
                shared.add(str(listing["place"]))
            continue  # this machine's run directory: its files are the head's
        out.append((RaySource(ray, actor, str(listing.get("where") or address)), listing))
    return out, shared, problems
