"""The manifest's node models (bot/manifest/nodes.py): one per kind, told apart by ``kind``
(``local`` when absent); what each kind says of itself; and the errors of a node section,
which read as they did before the union (no union tag in a path, the kinds named)."""

from __future__ import annotations

from pathlib import Path

from bot.manifest.nodes import (
    LocalNode,
    SSHNodeSpec,
    is_remote_node,
    node_identity,
    node_model,
    node_spec,
)
from tests.bot.manifest_helpers import dump, load, locs, make_project, merged

SSH = {"kind": "ssh", "host": "GPU-1.example", "port": 2222, "user": "ops", "workdir": "/w"}


def test_a_node_is_typed_by_its_kind(tmp_path: Path) -> None:
    make_project(tmp_path)
    assert isinstance(load(tmp_path, dump(merged())).manifest.node, LocalNode)
    node = load(tmp_path, dump(merged(node=SSH))).manifest.node
    assert isinstance(node, SSHNodeSpec) and node.is_remote
    assert node.identity == "ssh://gpu-1.example:2222"
    assert node.words == "ops@GPU-1.example:2222" and node.label == "ssh ops@GPU-1.example:2222"
    assert node.host_label == "GPU-1.example"
    local = LocalNode()
    assert (local.is_remote, local.identity, local.words, local.host_label) == (
        False, "local", "this machine", "the bot host")


def test_a_stored_node_section_is_read_by_its_kind() -> None:
    assert is_remote_node(SSH) and not is_remote_node({}) and not is_remote_node({"kind": "x"})
    assert node_model({}) is LocalNode and node_model({"kind": "x"}) is None
    assert node_identity(SSH) == "ssh://gpu-1.example:2222" and node_identity({}) == "local"
    assert isinstance(node_spec(SSH), SSHNodeSpec) and node_spec({"kind": "x"}) is None


def test_the_errors_of_a_node_section_name_its_fields(tmp_path: Path) -> None:
    make_project(tmp_path)
    found = locs(tmp_path, dump(merged(node={"kind": "vm"})))
    assert "input should be 'local' or 'ssh'; found 'vm'" in found["node.kind"].message
    found = locs(tmp_path, dump(merged(node="gpu-1")))
    assert "a valid dictionary or instance of Node;" in found["node"].message
    found = locs(tmp_path, dump(merged(node={**SSH, "hots": "x"})))
    assert "(did you mean 'host'?)" in found["node.hots"].message
    volume = {"inputs": {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12},
              "nodes": [{**SSH, "port": "x"}, {"kind": "vm"}]}
    found = locs(tmp_path, dump(merged(node=SSH, volume=volume)))
    assert "volume.nodes[0].port" in found and "volume.nodes[1].kind" in found
