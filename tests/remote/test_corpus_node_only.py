"""A corpus only the nodes hold (``volume.inputs.on_nodes`` without ``dir``) over two real
loopback sshd's (issue 23): the head lists it over SSH with the dispatcher's own command
runner, the SSH dispatcher's ``_prepare_all`` then holds every node to the head's listing,
nothing of the corpus is uploaded, and a corpus changed after the head's listing is refused
naming the node, the head and the input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.corpus import head_rows, listing_header
from bot.dispatch.corpus_head import list_on_head
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from bot.nodes.ssh.adapter import SSHAdapter
from tests.remote.sshd_server import Sshd
from tests.remote.test_volume_copies import COUNT, SIZE, dispatcher, prepare


def node_only_run(tmp_path: Path, nodes: list[dict[str, Any]], shared: Path,
                  steps: list[dict[str, Any]]) -> RunHandle:
    """A volume run whose corpus (``COUNT`` files of ``SIZE`` bytes) is only at ``shared``
    on the nodes: the bot host's project holds no copy of it."""
    project, run_dir = tmp_path / "project", tmp_path / "bot" / "runs" / "v1"
    project.mkdir(parents=True)
    (project / "app.py").write_text("VALUE = 1\n")
    shared.mkdir(parents=True)
    for i in range(COUNT):
        (shared / f"item-{i:05d}.txt").write_bytes(bytes([i]) * SIZE)
    run_dir.mkdir(parents=True)
    inputs = {"dir": str(shared), "pattern": "item-*.txt", "expected_count": COUNT,
              "expected_refusals": []}
    spec = {"project": {"dir": str(project), "requirements": None}, "inputs": inputs,
            "results": {}, "volume": {"gpus": False}}
    (run_dir / "spec.json").write_text(json.dumps(spec))
    volume = {"inputs": {"on_nodes": str(shared), "pattern": "item-*.txt",
                         "expected_count": COUNT}, "nodes": nodes}
    (run_dir / "manifest.yaml").write_text(json.dumps({"node": nodes[0], "volume": volume}))
    return RunHandle("v1", run_dir, run_dir / "spec.json", project, progress=steps.append)


def test_the_head_lists_it_over_ssh_and_every_node_is_held_to_that(
        tmp_path: Path, sshd: Sshd, sshd2: Sshd) -> None:
    shared = tmp_path / "shared" / "corpus"  # the same path on both nodes (one host here)
    nodes = [sshd.node(tmp_path / "n0"), sshd2.node(tmp_path / "n1")]
    steps: list[dict[str, Any]] = []
    handle = node_only_run(tmp_path, nodes, shared, steps)
    d = dispatcher([sshd, sshd2], tmp_path / "known_hosts")
    assert list_on_head(SSHAdapter(d, SSHNode.from_dict(nodes[0])), handle) == COUNT
    rows = head_rows(handle.run_dir)
    assert len(rows) == COUNT and {r[1] for r in rows} == {SIZE}
    assert steps[0]["phase"] == "listed" and steps[0]["count"] == COUNT
    assert listing_header(handle.run_dir)["node"] == f"{sshd.user}@127.0.0.1:{sshd.port}"
    copies = prepare(d, handle, nodes)
    assert not [p for p in d.streamed if "item-" in p]  # not one input uploaded
    for i, copy in enumerate(copies):
        assert json.loads(Path(copy.run_dir, "spec.json").read_text())["inputs"]["dir"] == \
            str(shared)
        assert not list((tmp_path / f"n{i}").rglob("item-*"))


def test_a_corpus_changed_after_the_heads_listing_is_refused(
        tmp_path: Path, sshd: Sshd, sshd2: Sshd) -> None:
    shared = tmp_path / "shared" / "corpus"
    nodes = [sshd.node(tmp_path / "n0"), sshd2.node(tmp_path / "n1")]
    handle = node_only_run(tmp_path, nodes, shared, [])
    d = dispatcher([sshd, sshd2], tmp_path / "known_hosts")
    list_on_head(SSHAdapter(d, SSHNode.from_dict(nodes[0])), handle)
    (shared / "item-00007.txt").write_bytes(b"\x07" * (SIZE - 1) + b"!")  # same size
    with pytest.raises(DispatchError) as refused:
        prepare(d, handle, nodes)
    head = f"{sshd.user}@127.0.0.1:{sshd.port}"
    assert str(refused.value).startswith(
        f"{head}: its copy of the corpus at volume.inputs.on_nodes {shared} differs from the "
        f"head node {head}'s listing: first differing input 'item-00007' (item-00007.txt: its "
        "SHA-256 differs)")


def test_a_head_whose_corpus_is_short_is_refused_before_anything_is_sent(
        tmp_path: Path, sshd: Sshd, sshd2: Sshd) -> None:
    shared = tmp_path / "shared" / "corpus"
    nodes = [sshd.node(tmp_path / "n0"), sshd2.node(tmp_path / "n1")]
    handle = node_only_run(tmp_path, nodes, shared, [])
    (shared / "item-00003.txt").unlink()
    d = dispatcher([sshd, sshd2], tmp_path / "known_hosts")
    try:
        with pytest.raises(DispatchError, match=rf"holds {COUNT - 1} input\(s\), "
                                                rf"volume.inputs.expected_count says {COUNT}"):
            list_on_head(SSHAdapter(d, SSHNode.from_dict(nodes[0])), handle)
    finally:
        d.close()
    assert not (tmp_path / "n0" / "runs").exists()
