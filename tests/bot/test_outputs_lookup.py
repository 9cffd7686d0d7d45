"""`preflight outputs RUN ID` through the service: an input's output found by its id in the
shard its worker wrote (the store's items name the line), else said where it lies."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.errors import ItemNotFound, PreflightError
from runner.outputs import ShardWriter
from tests.bot.fakes import pilot_script
from tests.bot.test_service import IDS, make, submit


def _script_with_outputs(refs: dict[str, str]) -> list[dict[str, object]]:
    script = pilot_script(IDS, refuse=("doc-04",))
    for event in script:
        if event["type"] == "item.done" and event["id"] in refs:
            event["output"] = refs[str(event["id"])]
    return script


def test_an_input_s_output_is_found_by_its_id_in_its_shard(tmp_path: Path) -> None:
    refs = {"doc-01": "outputs/shards/a1-w0-000001.jsonl#1",
            "doc-02": "outputs/shards/a1-w0-000001.jsonl#2",
            "doc-03": "outputs/shards/a1-w1-000001.jsonl#1"}
    service, _ = make(tmp_path, lambda run: _script_with_outputs(refs))
    run_id = submit(service, tmp_path)
    service.follower.follow(run_id, timeout=30)
    run_dir = service.records.record(run_id).run_dir
    written = ShardWriter(str(run_dir), "a1-w0").write(
        [{"id": i, "status": "accepted", "output": {"text": i.upper()}} for i in IDS[:2]])
    assert [r["output"] for r in written] == [refs["doc-01"], refs["doc-02"]]
    found = service.records.item_output(run_id[:20], "doc-02")
    assert (found.status, found.output, found.line) == ("accepted", {"text": "DOC-02"}, 2)
    assert found.file == run_dir / "outputs" / "shards" / "a1-w0-000001.jsonl"
    refused = service.records.item_output(run_id, "doc-04")
    assert refused.reference is None and refused.note == "no output: it was refused"
    # a shard still on its node (volume.outputs_on_nodes): where it lies, from the listing
    (run_dir / "outputs" / "on_nodes").mkdir(parents=True)
    (run_dir / "outputs" / "on_nodes" / "node-1.json").write_text(json.dumps(
        {"where": "gpu-b:/srv/runs/r", "run_dir": "/srv/runs/r",
         "files": {"shards/a1-w1-000001.jsonl": [10, "ab" * 32]}}))
    away = service.records.item_output(run_id, "doc-03")
    assert not away.found and "kept on its node: gpu-b:/srv/runs/r" in away.note
    with pytest.raises(ItemNotFound, match="recorded no input 'doc-99'"):
        service.records.item_output(run_id, "doc-99")
    (run_dir / "outputs" / "shards" / "a1-w0-000001.jsonl").write_text('{"id": "x"}\n' * 2)
    with pytest.raises(PreflightError, match="holds the output of 'x', not of 'doc-02'"):
        service.records.item_output(run_id, "doc-02")
    place = service.records.outputs_place(run_id)
    assert (place.shards, place.files) == (1, 0)
    assert place.on_nodes == ["outputs/on_nodes/node-1.json"]
