"""A several-node volume's outputs collected to the head (issues 23, 35): the shards and
files written on two nodes land in the head's ``outputs/`` (and in its evidence's
``SHA256SUMS``), each verified against its worker's record; a resume brings only what
is missing; a tampered shard is refused by name and nothing replaced; a node over its
cap is named and the rest kept; a node whose outputs hold a link or a FIFO has none
collected.

Each node is the runner's real node side (``runner.volume_collect.NodeOutputs``, with
its node's run directory as on a node, ``PREFLIGHT_NODE_RUN_DIR``), called directly
(``Direct``): no Ray here. Over Ray: tests/volume/test_volume_collect.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from runner.evidence import copy_evidence
from runner.ledger import Ledger, Row, ledger_path
from runner.outputs import ShardWriter, read_output
from runner.spec import NODE_RUN_DIR_ENV, NODE_WHERE_ENV
from runner.volume_collect import BOOK, DISK_RESERVE, NodeOutputs, ShardBook, collect_nodes
from runner.volume_stream import CHUNK, Piece


class Direct:
    """A node's stream without Ray: its ``NodeOutputs`` called directly. ``sent``: the
    files it sent pieces of; ``flip``: a file whose bytes are changed on the way;
    ``dies_after``: requests answered before it stops answering."""

    def __init__(self, node: NodeOutputs, where: str, *, flip: str = "",
                 dies_after: int = -1) -> None:
        self.node, self.where, self.flip, self.dies_after = node, where, flip, dies_after
        self.sent: list[str] = []
        self.requests = 0

    def send(self, pieces: list[Piece]) -> Any:
        return pieces

    def take(self, pieces: list[Piece]) -> list[bytes]:
        if self.requests == self.dies_after:
            raise TimeoutError("the node is gone")
        self.requests += 1
        chunks = self.node.read(pieces)
        self.sent += [rel for rel, _o, _n in pieces]
        return [bytes([c[0] ^ 1]) + c[1:] if rel == self.flip and off == 0 and c else c
                for (rel, off, _n), c in zip(pieces, chunks)]


def node(monkeypatch: pytest.MonkeyPatch, run_dir: Path, **kwargs: Any) -> tuple[Direct, Any]:
    monkeypatch.setenv(NODE_RUN_DIR_ENV, str(run_dir))
    monkeypatch.setenv(NODE_WHERE_ENV, run_dir.parent.parent.name)  # its workers' place
    side = NodeOutputs()
    return Direct(side, f"node-{run_dir.parent.parent.name}", **kwargs), side.listing()


def shards(head: Path, run_dir: Path, worker: str, batches: int, per: int = 3,
           ledger: Ledger | None = None) -> list[str]:
    """``batches`` shards written on ``run_dir`` by the real ShardWriter, recorded on the
    head as the driver records them (and in ``ledger``); returns the shards' paths."""
    writer = ShardWriter(str(run_dir), worker)
    paths = []
    for b in range(batches):
        results = writer.write([{"id": f"{worker}-{b}-{i}", "status": "accepted",
                                 "output": {"n": i, "pad": "x" * 200}} for i in range(per)])
        record = writer.drain()
        ShardBook(str(head)).add(f"{worker}@{run_dir.parent.parent.name}", record)
        paths += [r["shard"] for r in record]
        if ledger is not None:
            ledger.record([Row(r["id"], "accepted", output=r["output"]) for r in results])
    return paths


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def dirs(tmp_path: Path, *names: str) -> list[Path]:
    out = [tmp_path / d / "runs" / "v1" for d in names]
    for d in out:
        (d / "outputs").mkdir(parents=True, exist_ok=True)
    return out


def beat(where: str) -> None:
    pass


def test_the_worker_records_each_shards_size_and_sha256(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path), "a1-w0")
    writer.write([{"id": "x", "status": "accepted", "output": {"a": 1}}])
    [record] = writer.drain()
    data = (tmp_path / record["shard"]).read_bytes()
    assert record == {"shard": "outputs/shards/a1-w0-000001.jsonl", "bytes": len(data),
                      "sha256": hashlib.sha256(data).hexdigest()}
    assert writer.drain() == []


def test_the_book_skips_a_torn_line_and_malformed_entries(tmp_path: Path) -> None:
    book = ShardBook(str(tmp_path))
    book.add("w0", [{"shard": "outputs/shards/a.jsonl", "bytes": 3, "sha256": "a" * 64},
                    {"shard": "../../etc/passwd", "bytes": 3, "sha256": "a" * 64},
                    {"shard": "outputs/shards/b.jsonl", "bytes": "3", "sha256": "b" * 64}])
    book.add("w1", "not a list")
    with open(tmp_path / BOOK, "a", encoding="utf-8") as fh:
        fh.write('{"shard": "outputs/shards/c.jsonl", "by')  # a killed driver's last line
    assert book.read() == {"outputs/shards/a.jsonl": (3, "a" * 64, "w0")}


def test_two_nodes_shards_and_files_land_on_the_head_verified_and_in_the_evidence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    ledger = Ledger.open(ledger_path(str(head)))
    written = shards(head, n1, "a1-w1", 3, ledger=ledger) \
        + shards(head, n2, "a1-w2", 2, ledger=ledger)
    write(n1 / "outputs" / "masks" / "item-1.png", b"\x89PNG" + bytes(CHUNK + 5))
    write(n2 / "outputs" / "item-2.txt", b"two")
    write(n2 / "outputs" / ".item-3.txt.tmp-7", b"killed write")  # never collected
    facts = collect_nodes(str(head), [node(monkeypatch, n1), node(monkeypatch, n2)],
                          cap=1 << 30, beat=beat)
    assert facts["problems"] == [] and facts["nodes"] == 2 and facts["files"] == 7
    assert facts["recorded_shards"] == 5 and facts["present_files"] == 0
    for rel in [*written, "outputs/masks/item-1.png"]:
        source = n1 if "w1" in rel or "masks" in rel else n2
        assert (head / rel).read_bytes() == (source / rel).read_bytes()
    assert not (head / "outputs" / ".item-3.txt.tmp-7").exists()
    for row in ledger.rows():  # every output readable on the head by its id
        assert read_output(str(head), str(row.output), row.id)["pad"] == "x" * 200
    ledger.close()
    for name in ("manifest.yaml", "spec.json", "environment.json", "events.jsonl",
                 "balance.json", "balance.csv"):
        write(head / name, b"{}" if name.endswith("json") else b"id,status,category,reason\n")
    copy_evidence(str(head), str(tmp_path / "evidence"))
    sums = (tmp_path / "evidence" / "SHA256SUMS").read_text()
    for rel in (written[0], "outputs/item-2.txt"):
        assert f"{hashlib.sha256((head / rel).read_bytes()).hexdigest()}  {rel}" in sums


def test_a_resumed_collection_brings_only_what_is_missing_or_does_not_verify(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")
    written = shards(head, n1, "a1-w1", 4)
    assert collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30,
                         beat=beat)["files"] == 4
    (head / written[0]).unlink()                       # cut before it was written
    (head / written[1]).write_bytes(b"half a shard")   # not what its worker recorded
    again = node(monkeypatch, n1)
    facts = collect_nodes(str(head), [again], cap=1 << 30, beat=beat)
    assert facts["problems"] == []
    assert set(again[0].sent) == {w.removeprefix("outputs/") for w in written[:2]}
    assert facts["files"] == 2 and facts["present_files"] == 2
    assert (head / written[1]).read_bytes() == (n1 / written[1]).read_bytes()


def test_a_shard_tampered_on_its_node_is_refused_by_name_and_nothing_replaced(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")
    written = shards(head, n1, "a1-w1", 2)
    with open(n1 / written[0], "ab") as fh:  # changed after its worker recorded it
        fh.write(b'{"id": "planted"}\n')
    facts = collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30, beat=beat)
    [problem] = facts["problems"]
    assert problem.startswith(f"node-n1: {written[0]}: ") and "recorded" in problem
    assert "refused, nothing replaced" in problem
    assert not (head / written[0]).exists() and (head / written[1]).exists()


def test_a_shard_changed_on_the_way_is_refused_by_name(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")
    written = shards(head, n1, "a1-w1", 2)
    source, listing = node(monkeypatch, n1, flip=written[1].removeprefix("outputs/"))
    facts = collect_nodes(str(head), [(source, listing)], cap=1 << 30, beat=beat)
    [problem] = facts["problems"]
    assert problem.startswith(f"node-n1: {written[1]}: received with SHA-256")
    assert not (head / written[1]).exists() and (head / written[0]).exists()
    assert not [p for p in (head / "outputs" / "shards").iterdir() if p.name.startswith(".")]


def test_a_node_over_its_cap_is_named_and_the_rest_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    big = shards(head, n1, "a1-w1", 4, per=10)
    small = shards(head, n2, "a1-w2", 1)
    cap = 2 * (n1 / big[0]).stat().st_size + 10
    facts = collect_nodes(str(head), [node(monkeypatch, n1), node(monkeypatch, n2)],
                          cap=cap, beat=beat)
    [cut] = facts["problems"]  # the files past the cap named once, not again as missing
    assert cut.startswith(f"node-n1: its outputs pass the cap of {cap}")
    assert f"at {big[2]}: 2 file(s) from there on left on the node" in cut
    assert [(head / b).exists() for b in big] == [True, True, False, False]
    assert (head / small[0]).exists()  # the other node's, kept


def test_a_head_without_room_for_the_nodes_outputs_collects_nothing_and_says_why(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    first = shards(head, n1, "a1-w1", 2)
    second = shards(head, n2, "a1-w2", 1)
    sizes = [sum((n / s).stat().st_size for s in got)
             for n, got in ((n1, first), (n2, second))]
    asked: list[str] = []

    def free(path: str) -> int:  # the head's file system: a little short of room
        asked.append(path)
        return sum(sizes) + DISK_RESERVE - 1

    nodes = [node(monkeypatch, n1), node(monkeypatch, n2)]
    facts = collect_nodes(str(head), nodes, cap=1 << 30, beat=beat, free=free)
    assert asked == [os.path.realpath(head)]
    room = f"{sum(sizes) + DISK_RESERVE - 1:,} bytes free for the {sum(sizes):,} bytes"
    assert facts["problems"] == [  # each node named once, not again as missing
        f"node-n1: {sizes[0]:,} bytes of outputs to collect (2 file(s)), but the head's run "
        f"directory {os.path.realpath(head)} has {room} of every node (+ {DISK_RESERVE:,} "
        "kept free): nothing collected",
        f"node-n2: {sizes[1]:,} bytes of outputs to collect (1 file(s)), but the head's run "
        f"directory {os.path.realpath(head)} has {room} of every node (+ {DISK_RESERVE:,} "
        "kept free): nothing collected"]
    assert facts["files"] == 0 and not (head / "outputs" / "shards").exists()
    assert all(source.sent == [] for source, _l in nodes)  # not a byte asked of a node
    # room made: the same collection (a resume's) brings everything
    facts = collect_nodes(str(head), nodes, cap=1 << 30, beat=beat,
                          free=lambda _p: sum(sizes) + DISK_RESERVE)
    assert facts["problems"] == [] and facts["files"] == 3
    assert all((head / s).exists() for s in first + second)


def test_the_nodes_stream_at_the_same_time(tmp_path: Path,
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Each node's first answer waits for the other node's first request: collected one
    node after the other, the wait would end in a refusal."""
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    shards(head, n1, "a1-w1", 1)
    shards(head, n2, "a1-w2", 1)
    both = threading.Barrier(2, timeout=30)

    class Meeting(Direct):
        def take(self, pieces: list[Piece]) -> list[bytes]:
            if self.requests == 0:
                both.wait()
            return super().take(pieces)

    nodes = [node(monkeypatch, n) for n in (n1, n2)]
    met = [(Meeting(source.node, source.where), listing) for source, listing in nodes]
    facts = collect_nodes(str(head), met, cap=1 << 30, beat=beat)  # type: ignore[arg-type]
    assert facts["problems"] == [] and facts["files"] == 2


def test_a_node_that_stops_answering_keeps_what_came_and_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")
    write(n1 / "outputs" / "a.bin", bytes(CHUNK))
    write(n1 / "outputs" / "b.bin", bytes(CHUNK))
    source, listing = node(monkeypatch, n1, dies_after=1)
    facts = collect_nodes(str(head), [(source, listing)], cap=1 << 30, beat=beat)
    assert facts["problems"] == ["node-n1: no answer while sending outputs/b.bin: "
                                 "TimeoutError: the node is gone; the rest left on the node"]
    assert (head / "outputs" / "a.bin").stat().st_size == CHUNK
    assert not (head / "outputs" / "b.bin").exists()


def test_a_file_the_ledger_names_on_no_node_is_named_and_not_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")  # no worker recorded it: whose it is is unknown
    ledger = Ledger.open(ledger_path(str(head)))
    ledger.record([Row("x", "accepted", output="outputs/shards/a1-w9-000001.jsonl#1"),
                   Row("y", "accepted", output="outputs/masks/y.png")])
    ledger.close()
    facts = collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30, beat=beat)
    assert facts["problems"] == [
        "outputs/masks/y.png (named by the ledger): missing on the head, on no node of the "
        "cluster", "outputs/shards/a1-w9-000001.jsonl (named by the ledger): missing on the "
        "head, on no node of the cluster"]
    assert facts["forgotten_inputs"] == 0 and not (head / "lost_outputs.jsonl").exists()
    with Ledger.open(ledger_path(str(head))) as kept:
        assert [r.id for r in kept.rows()] == ["x", "y"] and kept.forgotten() == 0


def test_a_shard_whose_node_did_not_answer_or_refused_is_named_and_nothing_forgotten(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    ledger = Ledger.open(ledger_path(str(head)))
    shards(head, n1, "a1-w1", 1, ledger=ledger)
    gone = shards(head, n2, "a1-w2", 1, ledger=ledger)
    ledger.close()
    (n2 / gone[0]).unlink()
    facts = collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30, beat=beat)
    assert facts["problems"] == [f"{gone[0]} (written by worker a1-w2@n2): missing on the "
                                 "head, on no node of the cluster (its node n2 did not "
                                 "answer: nothing forgotten)"]  # its Ray gone: it may return
    write(n2 / "outputs" / "x.bin", bytes(10))
    (n2 / "outputs" / "leak.txt").symlink_to(n2 / "outputs" / "x.bin")
    refused = collect_nodes(str(head), [node(monkeypatch, n1), node(monkeypatch, n2)],
                            cap=1 << 30, beat=beat)
    assert refused["forgotten_inputs"] == 0 and len(refused["problems"]) == 2
    assert "nothing forgotten" in refused["problems"][1]  # a node that refused: not heard
    with Ledger.open(ledger_path(str(head))) as kept:
        assert kept.count() == 6 and kept.forgotten() == 0


def test_outputs_lost_by_their_node_are_forgotten_so_a_resume_runs_their_inputs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    ledger = Ledger.open(ledger_path(str(head)))
    kept = shards(head, n1, "a1-w1", 2, ledger=ledger)
    gone = shards(head, n2, "a1-w2", 3, ledger=ledger)
    ledger.record([Row("r", "refused", reason="bad input")])
    ledger.close()
    saved = {path: (n2 / path).read_bytes() for path in gone}
    for path in gone:
        (n2 / path).unlink()  # the node's disk replaced: it answers, without them
    write(head / gone[1], b"a torn copy")  # differs from its record: no good copy anywhere
    facts = collect_nodes(str(head), [node(monkeypatch, n1), node(monkeypatch, n2)],
                          cap=1 << 30, beat=beat)
    assert facts["files"] == 2 and facts["lost_files"] == 3
    assert facts["forgotten_inputs"] == 9  # 3 shards of 3 outputs
    [problem] = facts["problems"]
    assert problem.startswith("9 input(s) forgotten by the ledger, their outputs lost by "
                              f"the node that wrote them: {gone[0]} (written by worker "
                              "a1-w2@n2): missing on the head, on no node of the cluster "
                              "and 2 more (lost_outputs.jsonl)")
    assert "`preflight resume RUN` runs them again" in problem
    with Ledger.open(ledger_path(str(head))) as after:
        ids = {r.id for r in after.rows()}
        assert ids == {"r"} | {f"a1-w1-{b}-{i}" for b in range(2) for i in range(3)}
        assert after.forgotten() == 9 and after.forgotten_ids() == \
            {f"a1-w2-{b}-{i}" for b in range(3) for i in range(3)}
        assert after.done_ids() == ids  # what a resume skips: the 9 are run again
    lines = [json.loads(x) for x in (head / "lost_outputs.jsonl").read_text().splitlines()]
    assert sorted(x["file"] for x in lines) == sorted(gone)
    assert set(ShardBook(str(head)).read()) == set(kept)  # the next collection's record
    assert (head / "lost" / gone[1]).read_bytes() == b"a torn copy"  # kept aside
    assert not (head / gone[1]).exists()
    again = collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30, beat=beat)
    assert again["problems"] == [] and again["forgotten_inputs"] == 0  # nothing lost now
    for path, data in saved.items():
        write(n2 / path, data)  # found again on the node: its inputs ran again meanwhile
    back = node(monkeypatch, n2)
    returned = collect_nodes(str(head), [node(monkeypatch, n1), back], cap=1 << 30, beat=beat)
    assert returned["problems"] == [] and returned["files"] == 0 and back[0].sent == []
    assert not any((head / path).exists() for path in gone)


def test_a_lost_shard_a_killed_runner_left_on_the_head_is_set_aside_and_the_log_read_whole(
        tmp_path: Path) -> None:
    from runner.volume_lost import LOST_LOG, forget_lost, lost_files

    head, = dirs(tmp_path, "head")
    first, second = "outputs/shards/a1-w2-000001.jsonl", "outputs/shards/a1-w2-000002.jsonl"
    (head / LOST_LOG).write_text(json.dumps({"file": first, "why": "lost"}) + "\n"
                                 + '{"file": "outputs/sha')  # killed mid-line
    write(head / first, b"a copy step 4 never moved")
    assert collect_nodes(str(head), [], cap=1 << 30, beat=beat)["problems"] == []
    assert not (head / first).exists() and (head / "lost" / first).exists()
    forget_lost(str(head), {second: "lost", "outputs/x.png": "not a shard", "../../etc":
                            "not a shard"}, str(head / BOOK))
    assert lost_files(str(head)) == {first, second}  # the torn line did not eat the next


def test_a_worker_cannot_record_another_workers_shard(tmp_path: Path) -> None:
    book = ShardBook(str(tmp_path))
    own = {"shard": "outputs/shards/a2-w3-000001.jsonl", "bytes": 1, "sha256": "a" * 64}
    other = {"shard": "outputs/shards/a2-w4-000001.jsonl", "bytes": 1, "sha256": "b" * 64}
    longer = {"shard": "outputs/shards/a2-w31-000001.jsonl", "bytes": 1, "sha256": "c" * 64}
    book.add("w3@gpu-2[0]", [own, other, longer], prefix="a2-w3")
    assert set(book.read()) == {own["shard"]}


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_node_whose_outputs_hold_a_link_or_fifo_has_none_collected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    head, n1, n2 = dirs(tmp_path, "head", "n1", "n2")
    write(n1 / "outputs" / "item-1.txt", b"one")
    if kind == "link":
        (n1 / "outputs" / "leak.txt").symlink_to(Path.home() / ".ssh" / "id_ed25519")
    else:
        os.mkfifo(n1 / "outputs" / "leak.txt")
    write(n2 / "outputs" / "item-2.txt", b"two")
    facts = collect_nodes(str(head), [node(monkeypatch, n1), node(monkeypatch, n2)],
                          cap=1 << 30, beat=beat)
    why = "a symbolic link" if kind == "link" else "not a regular file"
    assert facts["problems"] == [f"node-n1: outputs/leak.txt: {why}; none of its outputs "
                                 "collected"]
    assert facts["files"] == 1 and not (head / "outputs" / "item-1.txt").exists()
    assert not (head / "outputs" / "leak.txt").exists()
    assert (head / "outputs" / "item-2.txt").read_bytes() == b"two"



def test_a_head_file_of_the_same_name_is_kept_and_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")
    write(head / "outputs" / "summary.txt", b"the head's")
    write(n1 / "outputs" / "summary.txt", b"the node's")
    facts = collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30, beat=beat)
    assert facts["problems"] == ["node-n1: outputs/summary.txt: the head holds another "
                                 "file under that name (kept)"]
    assert (head / "outputs" / "summary.txt").read_bytes() == b"the head's"


def test_outputs_kept_on_their_nodes_leave_each_nodes_listing_on_the_head(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = dirs(tmp_path, "head", "n1")
    big = write(n1 / "outputs" / "renders" / "frame-1.exr", bytes(70000))
    facts = collect_nodes(str(head), [node(monkeypatch, n1)], cap=1 << 30, beat=beat,
                          keep_on_nodes=True)
    assert facts["files"] == 1 and facts["bytes"] == 70000 and facts["kept_on_nodes"]
    assert not (head / "outputs" / "renders").exists()  # the file stays on its node
    listing = json.loads((head / "outputs" / "on_nodes" / "node-0.json").read_text())
    assert listing["files"] == {"renders/frame-1.exr": [
        70000, hashlib.sha256(big.read_bytes()).hexdigest()]}
    assert listing["run_dir"] == str(n1) and listing["refused"] == []


def test_a_resume_replays_the_rerun_events_a_killed_runner_lost(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from runner.events import ITEM_DONE, EventWriter
    from runner.stages.pilot import _replay

    lost, again = "outputs/shards/a1-w2-000001.jsonl", "outputs/shards/a2-w0-000001.jsonl"
    ledger = Ledger.open(ledger_path(str(tmp_path)))
    ledger.record([Row("a", "accepted", "x", output=f"{lost}#1"), Row("b", "accepted", "x")])
    assert ledger.forget_shards({lost: "lost by its node"}) == {lost: 1}
    assert ledger.forgotten_ids() == {"a"}
    ledger.record([Row("a", "accepted", "y", output=f"{again}#1")])  # run again
    assert ledger.forgotten_ids() == set() and ledger.forgotten_counts() == {"a": 1}
    events = tmp_path / "events.jsonl"
    writer = EventWriter(str(events), "r1")
    for row in ledger.rows():  # the first attempt's events: the rerun's never written
        writer.emit(ITEM_DONE, id=row.id, status="accepted", category="x")
    writer.close()
    emitted: list[tuple[str, dict[str, Any]]] = []
    ctx = SimpleNamespace(run_dir=str(tmp_path), emit=lambda t, **d: emitted.append((t, d)))
    assert _replay(ctx, ledger) == 1  # type: ignore[arg-type]
    assert emitted == [(ITEM_DONE, {"replayed": True, "rerun": True, "id": "a",
                                    "status": "accepted", "category": "y",
                                    "output": f"{again}#1"})]
    writer = EventWriter.resume(str(events), "r1")  # that rerun event written this time
    writer.emit(ITEM_DONE, id="a", status="accepted", category="y", rerun=True)
    writer.close()
    assert ledger.forget_shards({again: "lost again"}) == {again: 1}  # a second time
    ledger.record([Row("a", "refused", reason="timeout")])
    emitted.clear()
    assert _replay(ctx, ledger) == 1  # type: ignore[arg-type]  # the second rerun's
    assert emitted == [(ITEM_DONE, {"replayed": True, "rerun": True, "id": "a",
                                    "status": "refused", "reason": "timeout"})]
    ledger.close()
