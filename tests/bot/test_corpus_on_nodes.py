"""A volume corpus already on the nodes (``volume.inputs.on_nodes``): the manifest field,
the policy's rule for a Slack manifest, the node's listing (the runner's rule) and the
comparison that names the first differing input. Over a real sshd: test_volume_copies.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.corpus import NODE_CORPUS_SCRIPT, Reference, check_listing, expected_rows
from bot.errors import DispatchError
from bot.manifest.source import parse_text
from bot.node_programs.corpus_listing import listing_digest
from bot.policy import Identity, checks, default_policy, load_policy
from runner.inputs import list_dir
from tests.bot.manifest_helpers import dump, locs, make_project, merged

NODE = {"kind": "ssh", "host": "gpu-1.example.net", "port": 2222, "user": "gpu"}


def volume(on_nodes: Any, **more: Any) -> dict[str, Any]:
    return {"inputs": {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12,
                       "on_nodes": on_nodes}, "nodes": [NODE, {**NODE, "host": "gpu-2"}],
            **more}


@pytest.mark.parametrize(("value", "why"), [
    ("data/corpus", "an absolute path on the nodes"),
    ("/data/../home/gpu/.ssh", "a path without '..'"),
])
def test_on_nodes_must_be_an_absolute_node_path_without_dotdot(
        tmp_path: Path, value: str, why: str) -> None:
    root = make_project(tmp_path)
    found = locs(root, dump(merged(node=NODE, volume=volume(value))))
    assert why in found["volume.inputs.on_nodes"].message


def test_on_nodes_is_for_ssh_nodes_not_this_machine(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    local = merged(node={"kind": "local"}, volume={**volume("/data/corpus"),
                                                   "nodes": [{"kind": "local"}]})
    assert "runs on this machine" in locs(root, dump(local))["volume.inputs.on_nodes"].message


def slack(policy_text: str | None, data: dict[str, Any], tmp_path: Path) -> list[Any]:
    base = tmp_path / "projects"
    (base / "team" / "data" / "pilote").mkdir(parents=True, exist_ok=True)
    if policy_text is None:
        policy = default_policy(tmp_path)
    else:
        (tmp_path / "policy.yaml").write_text(policy_text, encoding="utf-8")
        policy = load_policy(tmp_path / "policy.yaml", home=tmp_path)
    parsed, marks = parse_text(dump(data))
    return [r for r in checks.check_submission(policy, parsed, marks, origin="slack",
                                               who=Identity("U0MEMBER"), base_dir=base)
            if r.rule == "node_corpus_roots"]


def test_a_slack_manifest_names_a_node_corpus_only_under_the_policys_roots(
        tmp_path: Path) -> None:
    data = merged(project={"dir": "team"}, node=NODE, volume=volume("/data/corpus/v2"))
    refused = slack(None, data, tmp_path)  # no node_corpus_roots: refused from Slack
    assert len(refused) == 1
    assert refused[0].message.startswith("volume.inputs.on_nodes (line")
    assert "lists no node_corpus_roots" in refused[0].message
    assert slack("node_corpus_roots: [/data/corpus]\n", data, tmp_path) == []
    outside = merged(project={"dir": "team"}, node=NODE, volume=volume("/home/gpu/.ssh"))
    refused = slack("node_corpus_roots: [/data/corpus]\n", outside, tmp_path)
    assert "'/home/gpu/.ssh' is not under the node corpus roots (/data/corpus)" in \
        refused[0].message
    assert "policy.yaml line 1 (node_corpus_roots)" in refused[0].where
    sneaky = merged(project={"dir": "team"}, node=NODE, volume=volume("/data/corpus/../..x"))
    assert slack("node_corpus_roots: [/data/corpus]\n", sneaky, tmp_path)
    prefix = merged(project={"dir": "team"}, node=NODE, volume=volume("/data/corpus-other"))
    assert slack("node_corpus_roots: [/data/corpus]\n", prefix, tmp_path)


def test_the_nodes_listing_is_the_runners_and_agrees_with_the_bots_rows(
        tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for name in ("doc-2.txt", "doc-1.txt", ".hidden.txt", "other.bin"):
        (corpus / name).write_text(name)
    (corpus / "doc-sub.txt").mkdir()  # a folder that matches: not an input
    (corpus / "doc-3.txt").symlink_to(corpus / "doc-1.txt")  # the runner reads it: one
    items = list_dir(str(corpus), "doc-*.txt")
    files = {os.path.basename(i.path): (Path(i.path), _sha(Path(i.path))) for i in items}
    rows = expected_rows(files)
    out = subprocess.run([sys.executable, "-c", NODE_CORPUS_SCRIPT, str(corpus), "doc-*.txt",
                          listing_digest(rows)], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == [json.dumps({"count": 3, "digest": listing_digest(rows)})]
    # agrees: nothing raised
    check_listing("gpu-1:22", "/data/corpus", Reference.of(rows), out.stdout)
    (corpus / "doc-2.txt").write_text("changed")
    out = subprocess.run([sys.executable, "-c", NODE_CORPUS_SCRIPT, str(corpus), "doc-*.txt",
                          listing_digest(rows)], capture_output=True, text=True, check=True)
    with pytest.raises(DispatchError) as refused:
        check_listing("gpu-1:22", "/data/corpus", Reference.of(rows), out.stdout)
    assert str(refused.value).startswith(
        "gpu-1:22: its copy of the corpus at volume.inputs.on_nodes /data/corpus differs from "
        "the bot's volume.inputs.dir: first differing input 'doc-2' (doc-2.txt: its size "
        "differs)")


@pytest.mark.parametrize(("theirs", "why"), [
    ([["a.txt", 1, "x"], ["c.txt", 1, "z"]], "'b' (b.txt is missing on the node)"),
    ([["a.txt", 1, "x"], ["b.txt", 1, "y"], ["bb.txt", 1, "q"], ["c.txt", 1, "z"]],
     "'bb' (bb.txt is on the node, not in the bot's copy)"),
    ([["a.txt", 1, "x"], ["b.txt", 1, "Y"], ["c.txt", 1, "z"]],
     "'b' (b.txt: its SHA-256 differs)"),
])
def test_the_first_differing_input_is_named(theirs: list[list[Any]], why: str) -> None:
    rows = [("a.txt", 1, "x"), ("b.txt", 1, "y"), ("c.txt", 1, "z")]
    reply = "\n".join([json.dumps({"count": len(theirs), "digest": "other"}),
                       *map(json.dumps, theirs)])  # the header, then one row a line
    with pytest.raises(DispatchError, match="first differing input " + why.replace("(", r"\(")
                       .replace(")", r"\)")):
        check_listing("gpu-2:22", "/data/corpus", Reference.of(rows), reply)


def test_a_node_without_the_folder_is_refused_saying_so() -> None:
    with pytest.raises(DispatchError, match="gpu-2:22: volume.inputs.on_nodes /data/corpus "
                                            "cannot be listed on the node"):
        check_listing("gpu-2:22", "/data/corpus", Reference.of([]),
                      json.dumps({"error": "/data/corpus: No such file or directory"}))


def _sha(path: Path) -> str:
    import hashlib

    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_forecast_counts_a_corpus_on_the_nodes_as_checked_not_uploaded() -> None:
    from bot.pilot.forecast import Setup, forecast
    from tests.bot.test_forecast import h100

    def upload(on_nodes: bool) -> Any:
        return forecast(h100(rented_cards=16, lots=16, nodes=2, healthy_cards=8,
                             volume_bytes=500_000_000,
                             setup=Setup(diagnostics_s=6.0, dispatch_s=1.5, proof_s=4.0,
                                         ssh=True, inputs_on_nodes=on_nodes)))

    sent, checked = upload(False), upload(True)
    assert sent.numbers["setup_upload_s"] == 20.0  # 500 MB ÷ 50 MB/s × 2 nodes
    assert checked.numbers["setup_upload_s"] == 1.0  # 500 MB ÷ 500 MB/s, every node at once
    assert checked.figure("setup_upload").formula == (
        "500,000,000 B ÷ 500 MB/s (estimated), read and hashed on every node at once "
        "(volume.inputs.on_nodes: none uploaded)")


def test_the_bots_copy_is_hashed_once_for_every_node_until_a_file_changes(
        tmp_path: Path) -> None:
    from bot.dispatch.corpus import reference_rows
    from bot.dispatch.inputs_check import CheckedInputs

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"doc-{i}.txt").write_text(f"text {i}")
    inputs = CheckedInputs(corpus, {p.name: p for p in corpus.iterdir()})
    first = reference_rows(inputs)
    assert reference_rows(inputs) is first  # the second node: no second read
    (corpus / "doc-1.txt").write_text("changed, longer")
    again = reference_rows(inputs)
    assert again is not first and again[1][1:] == (15, _sha(corpus / "doc-1.txt"))


def test_outputs_on_nodes_reaches_the_volumes_spec(tmp_path: Path) -> None:
    from bot.manifest.load import load_manifest_file
    from bot.pilot.plan import make_plan
    from bot.pilot.specbuild import build_spec
    from runner.spec import RunSpec
    from tests.bot.fakes import write_manifest

    def volume_spec(extra: str) -> Any:
        path = write_manifest(tmp_path, extra="volume:\n  inputs: {dir: data/pilote, "
                              "expected_count: 4}\n" + extra)
        loaded = load_manifest_file(path)
        assert loaded.manifest.volume is not None
        spec = build_spec(loaded, make_plan(loaded), "v1",
                          inputs=loaded.manifest.volume.inputs, kind="volume")
        return RunSpec.from_dict(spec.to_dict()).volume  # what the runner reads

    assert volume_spec("").outputs_on_nodes is False  # collected to the head
    assert volume_spec("  outputs_on_nodes: true\n").outputs_on_nodes is True


def test_collect_max_bytes_reaches_the_volumes_spec_and_a_tiny_one_is_refused(
        tmp_path: Path) -> None:
    from bot.errors import ManifestError
    from bot.manifest.load import load_manifest_file
    from bot.pilot.plan import make_plan
    from bot.pilot.specbuild import build_spec
    from runner.spec import RunSpec
    from runner.volume_collect import DEFAULT_CAP
    from tests.bot.fakes import write_manifest

    def manifest(extra: str) -> Any:
        return load_manifest_file(write_manifest(
            tmp_path, extra="volume:\n  inputs: {dir: data/pilote, expected_count: 4}\n"
                            + extra))

    def volume_spec(extra: str) -> Any:
        loaded = manifest(extra)
        spec = build_spec(loaded, make_plan(loaded), "v1",
                          inputs=loaded.manifest.volume.inputs, kind="volume")
        return RunSpec.from_dict(spec.to_dict()).volume

    assert volume_spec("").collect_max_bytes == 0  # the runner's default, 64 GiB
    assert DEFAULT_CAP == 64 << 30
    assert volume_spec(f"  collect_max_bytes: {8 << 30}\n").collect_max_bytes == 8 << 30
    with pytest.raises(ManifestError, match="volume.collect_max_bytes"):
        manifest("  collect_max_bytes: 1000\n")
