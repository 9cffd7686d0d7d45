"""A corpus only the nodes hold (``volume.inputs.on_nodes``) on the node-agnostic
dispatcher (``NodeDispatcher``), over the tests' ``container`` kind: the head lists it
through its ``Node`` at the start (a short corpus refused before anything is sent), each
node's copy is held to that listing after its own copy of the run (nothing of the corpus
uploaded), and a corpus changed after the head's listing is refused naming the node, the
head and the input. No Ray: the card proofs and Ray that follow are tested elsewhere
(test_volume_containers.py)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.corpus import head_rows
from bot.dispatch.corpus_head import list_on_head
from bot.dispatch.node_dispatcher import NodeDispatcher
from bot.dispatch.plan import plan_of
from bot.errors import DispatchError
from bot.nodes import registry
from bot.settings import Settings
from tests.bot.container_kind import container_kind
from tests.remote.test_corpus_node_only import node_only_run
from tests.remote.test_volume_copies import COUNT


def _setup(tmp_path: Path) -> tuple[NodeDispatcher, list[dict[str, Any]], Path]:
    root = tmp_path / "containers"
    nodes = [{"kind": "container", "container": name, "host": "127.0.0.1",
              "workdir": str(root / name / "work"), "python": sys.executable}
             for name in ("box-1", "box-2")]
    for node in nodes:
        Path(node["workdir"]).parent.mkdir(parents=True)
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path / "home")})
    dispatcher = container_kind(root).build(settings)
    assert isinstance(dispatcher, NodeDispatcher)
    return dispatcher, nodes, tmp_path / "shared" / "corpus"


def test_every_container_is_held_to_the_heads_listing(tmp_path: Path) -> None:
    dispatcher, nodes, shared = _setup(tmp_path)
    steps: list[dict[str, Any]] = []
    with registry.registered(container_kind(tmp_path / "containers")):
        handle = node_only_run(tmp_path, nodes, shared, steps)
        specs = plan_of(handle).volume_nodes
        assert list_on_head(dispatcher.node_of(specs[0]), handle) == COUNT
        assert len(head_rows(handle.run_dir)) == COUNT and steps[0]["phase"] == "listed"
        for i, spec in enumerate(specs):
            copy = dispatcher._copy(handle, i, spec, dispatcher.node_of(spec))
            sent = json.loads(Path(copy.remote_run_dir, "spec.json").read_text())
            assert sent["inputs"]["dir"] == str(shared)  # the node's own copy, in place
            assert not list(Path(nodes[i]["workdir"]).rglob("item-*"))  # none uploaded
        (shared / "item-00007.txt").write_bytes(b"changed")
        with pytest.raises(DispatchError) as refused:
            dispatcher._copy(handle, 1, specs[1], dispatcher.node_of(specs[1]))
    assert str(refused.value).startswith(
        f"container box-2: its copy of the corpus at volume.inputs.on_nodes {shared} differs "
        "from the head node container box-1's listing: first differing input 'item-00007'")


def test_a_short_corpus_on_the_head_refuses_the_start_before_anything_is_sent(
        tmp_path: Path) -> None:
    dispatcher, nodes, shared = _setup(tmp_path)
    with registry.registered(container_kind(tmp_path / "containers")):
        handle = node_only_run(tmp_path, nodes, shared, [])
        (shared / "item-00003.txt").unlink()
        with pytest.raises(DispatchError, match=rf"volume.nodes\[0\] \(container box-1\): "
                                                rf".* holds {COUNT - 1} input\(s\), "
                                                rf"volume.inputs.expected_count says {COUNT}"):
            dispatcher.start(handle)
    for node in nodes:  # nothing was sent (the listing keeps its digests in the workdir)
        assert not (Path(node["workdir"]) / "runs").exists()
