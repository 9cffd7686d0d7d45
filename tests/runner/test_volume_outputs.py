"""A several-node volume's outputs collected to the head (issue 23): the files handlers
wrote on two nodes land in the head's ``outputs/`` and in its evidence's ``SHA256SUMS``;
a node whose outputs hold a link or a FIFO has none collected, named.

The workers are the runner's real worker class (``runner.volume_ray._Worker``), each with
its node's run directory as on a node (``PREFLIGHT_NODE_RUN_DIR``); only Ray's remote call
is replaced by a direct one (``Direct``), no Ray here. Over Ray: test_volume_service.py.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runner.evidence import copy_evidence
from runner.spec import NODE_RUN_DIR_ENV
from runner.volume_collect import collect_node_outputs
from runner.volume_ray import _Worker
from runner.volume_workers import Worker


class _Method:
    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        return self.fn(*args)


class Direct:
    """An actor whose ``.method.remote(...)`` is the call itself (Ray's object: its value)."""

    def __init__(self, target: Any) -> None:
        self.target = target

    def __getattr__(self, name: str) -> _Method:
        return _Method(getattr(self.target, name))


class NoRay:
    @staticmethod
    def get(value: Any, timeout: float | None = None) -> Any:
        return value


@dataclass
class Ctx:
    run_dir: str


def node_worker(monkeypatch: pytest.MonkeyPatch, key: int, run_dir: Path) -> Worker:
    monkeypatch.setenv(NODE_RUN_DIR_ENV, str(run_dir))
    return Worker(key, Direct(_Worker({}, "", [], "cpu")))


def write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def test_two_nodes_outputs_land_on_the_head_with_checksums_in_the_evidence(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1, n2 = (tmp_path / d / "runs" / "v1" for d in ("head", "n1", "n2"))
    write(head / "outputs" / "item-0.json", b"{}")  # the driver's own, on the head
    write(n1 / "outputs" / "masks" / "item-1.png", b"\x89PNG" + bytes(20000))
    write(n2 / "outputs" / "item-2.txt", b"two")
    write(n2 / "outputs" / ".item-3.txt.tmp", b"killed write")  # never collected
    workers = [node_worker(monkeypatch, 0, head), node_worker(monkeypatch, 1, n1),
               node_worker(monkeypatch, 2, n1), node_worker(monkeypatch, 3, n2)]
    facts = collect_node_outputs(Ctx(str(head)), NoRay(), workers)  # type: ignore[arg-type]
    assert facts == {"files": 2, "bytes": 20007, "nodes": 2, "refused": []}
    assert (head / "outputs" / "masks" / "item-1.png").read_bytes() == \
        (n1 / "outputs" / "masks" / "item-1.png").read_bytes()
    assert (head / "outputs" / "item-2.txt").read_bytes() == b"two"
    assert not (head / "outputs" / ".item-3.txt.tmp").exists()
    for name in ("manifest.yaml", "spec.json", "environment.json", "events.jsonl",
                 "balance.json", "balance.csv"):
        write(head / name, b"{}" if name.endswith("json") else b"id,status,category,reason\n")
    copy_evidence(str(head), str(tmp_path / "evidence"))
    sums = (tmp_path / "evidence" / "SHA256SUMS").read_text()
    for rel in ("outputs/masks/item-1.png", "outputs/item-2.txt"):
        digest = hashlib.sha256((head / rel).read_bytes()).hexdigest()
        assert f"{digest}  {rel}" in sums


@pytest.mark.parametrize("kind", ["link", "fifo"])
def test_a_node_whose_outputs_hold_a_link_or_fifo_has_none_collected(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    head, n1, n2 = (tmp_path / d / "runs" / "v1" for d in ("head", "n1", "n2"))
    (head / "outputs").mkdir(parents=True)
    write(n1 / "outputs" / "item-1.txt", b"one")
    if kind == "link":
        (n1 / "outputs" / "leak.txt").symlink_to(Path.home() / ".ssh" / "id_ed25519")
    else:
        os.mkfifo(n1 / "outputs" / "leak.txt")
    write(n2 / "outputs" / "item-2.txt", b"two")
    workers = [node_worker(monkeypatch, 0, head), node_worker(monkeypatch, 1, n1),
               node_worker(monkeypatch, 2, n2)]
    facts = collect_node_outputs(Ctx(str(head)), NoRay(), workers)  # type: ignore[arg-type]
    why = "a symbolic link" if kind == "link" else "not a regular file"
    assert facts["refused"] == [f"{os.uname().nodename}:{n1}: outputs/leak.txt: {why}; none "
                                "of its outputs collected"]
    assert facts["files"] == 1 and not (head / "outputs" / "item-1.txt").exists()
    assert not (head / "outputs" / "leak.txt").exists()
    assert (head / "outputs" / "item-2.txt").read_bytes() == b"two"


def test_a_head_file_of_the_same_name_is_kept_and_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    head, n1 = (tmp_path / d / "runs" / "v1" for d in ("head", "n1"))
    write(head / "outputs" / "summary.txt", b"the head's")
    write(n1 / "outputs" / "summary.txt", b"the node's")
    facts = collect_node_outputs(Ctx(str(head)), NoRay(),  # type: ignore[arg-type]
                                 [node_worker(monkeypatch, 0, n1)])
    assert facts["refused"] == [f"{os.uname().nodename}:{n1}: outputs/summary.txt: the head "
                                "holds another file under that name (kept)"]
    assert (head / "outputs" / "summary.txt").read_bytes() == b"the head's"


def test_outputs_kept_on_their_nodes_leave_each_nodes_listing_on_the_head(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    head, n1 = (tmp_path / d / "runs" / "v1" for d in ("head", "n1"))
    (head / "outputs").mkdir(parents=True)
    big = write(n1 / "outputs" / "renders" / "frame-1.exr", bytes(70000))
    workers = [node_worker(monkeypatch, 0, head), node_worker(monkeypatch, 1, n1)]
    facts = collect_node_outputs(Ctx(str(head)), NoRay(), workers,  # type: ignore[arg-type]
                                 keep_on_nodes=True)
    assert facts == {"files": 1, "bytes": 70000, "nodes": 1, "refused": [],
                     "kept_on_nodes": True}
    assert not (head / "outputs" / "renders").exists()  # the file stays on its node
    listing = json.loads((head / "outputs" / "on_nodes" / "node-1.json").read_text())
    assert listing["files"] == {"renders/frame-1.exr": [
        70000, hashlib.sha256(big.read_bytes()).hexdigest()]}
    assert listing["run_dir"] == str(n1) and listing["refused"] == []
