"""A volume worker's outputs: one shard per batch, found again by id (runner/outputs.py)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import runner.outputs as outputs
from runner.outputs import OutputsError, ShardWriter, parse_ref, read_output, summary


def test_a_batch_s_outputs_go_to_one_shard_and_each_is_found_by_its_id(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path), "a1-w0")
    results = [{"id": f"d{k}", "status": "accepted", "category": "x", "output": {"k": k}}
               for k in range(3)] + [{"id": "d3", "status": "refused", "reason": "empty"}]
    out = writer.write(results)
    assert [r["output"] for r in out[:3]] == [f"outputs/shards/a1-w0-000001.jsonl#{n}"
                                              for n in (1, 2, 3)]
    assert out[3] == results[3]  # no output: left as it was
    assert [read_output(str(tmp_path), r["output"], r["id"]) for r in out[:3]] == [
        {"k": 0}, {"k": 1}, {"k": 2}]
    shard = tmp_path / "outputs" / "shards" / "a1-w0-000001.jsonl"
    assert [json.loads(x)["id"] for x in shard.read_text().splitlines()] == ["d0", "d1", "d2"]
    assert os.listdir(shard.parent) == [shard.name]  # no temporary file left
    second = writer.write([{"id": "d9", "status": "accepted", "output": [1, 2]}])
    assert second[0]["output"] == "outputs/shards/a1-w0-000002.jsonl#1"
    assert writer.write([{"id": "d8", "status": "accepted", "category": "x"}])  # no shard
    assert sorted(os.listdir(shard.parent)) == ["a1-w0-000001.jsonl", "a1-w0-000002.jsonl"]
    found = summary(str(tmp_path))
    assert (found["shards"], found["files"]) == (2, 0)
    again = ShardWriter(str(tmp_path), "a1-w0")  # the same names: never replaced
    assert again.write([{"id": "d7", "status": "accepted", "output": 7}])[0]["output"] == 7
    third = again.write([{"id": "d7", "status": "accepted", "output": {"v": 7}}])
    assert third[0]["output"] == "outputs/shards/a1-w0-000003.jsonl#1"
    assert read_output(str(tmp_path), "outputs/shards/a1-w0-000001.jsonl#1", "d0") == {"k": 0}


def test_a_bad_output_refuses_its_input_and_the_rest_of_the_batch_is_kept(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(outputs, "MAX_OUTPUT_BYTES", 200)
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "mine.bin").write_bytes(b"x")
    writer = ShardWriter(str(tmp_path), "a2-w1")
    out = writer.write([
        {"id": "ok", "status": "accepted", "category": "x", "output": {"fine": True}},
        {"id": "set", "status": "accepted", "category": "x", "output": {"s": {1, 2}}},
        {"id": "nan", "status": "accepted", "category": "x", "output": [float("nan")]},
        {"id": "big", "status": "accepted", "category": "x", "output": {"t": "y" * 500}},
        {"id": "away", "status": "accepted", "category": "x", "output": "/etc/passwd"},
        {"id": "up", "status": "accepted", "category": "x", "output": "outputs/../spec.json"},
        {"id": "file", "status": "accepted", "category": "x",
         "output": str(tmp_path / "outputs" / "mine.bin")},
    ])
    by = {r["id"]: r for r in out}
    assert by["ok"]["output"] == "outputs/shards/a2-w1-000001.jsonl#1"
    assert by["set"]["status"] == "refused" and by["set"]["reason"].startswith(
        "output is not JSON (TypeError")
    assert by["nan"]["status"] == "refused" and "not JSON (ValueError" in by["nan"]["reason"]
    assert by["big"]["status"] == "refused" and "over the 200 bytes" in by["big"]["reason"]
    for iid in ("away", "up"):
        assert by[iid]["status"] == "refused"
        assert "lies outside the outputs folder" in by[iid]["reason"]
    assert by["file"] == {"id": "file", "status": "accepted", "category": "x",
                          "output": "outputs/mine.bin"}
    assert writer.write("not a list") == "not a list"  # the driver's audit says why


def test_a_reference_that_leads_nowhere_is_an_error_naming_the_shard(tmp_path: Path) -> None:
    writer = ShardWriter(str(tmp_path), "a1-w0")
    ref = writer.write([{"id": "d0", "status": "accepted", "output": {"v": 1}}])[0]["output"]
    with pytest.raises(OutputsError, match="holds the output of 'd0', not of 'd1'"):
        read_output(str(tmp_path), ref, "d1")
    with pytest.raises(OutputsError, match="has no line 2"):
        read_output(str(tmp_path), ref.replace("#1", "#2"), "d0")
    with pytest.raises(OutputsError, match="cannot be read"):
        read_output(str(tmp_path), "outputs/shards/gone.jsonl#1", "d0")
    for bad in ("outputs/d0.json", "outputs/shards/../../x.jsonl#1", "/outputs/shards/x.jsonl#1",
                "outputs/shards/x.jsonl#0", "outputs/shards/x.jsonl#a", "x/shards/y.jsonl#1"):
        assert parse_ref(bad) is None, bad
    link = tmp_path / "outputs" / "shards" / "link.jsonl"
    link.symlink_to(tmp_path / "outputs" / "shards" / "a1-w0-000001.jsonl")
    with pytest.raises(OutputsError, match="cannot be read"):
        read_output(str(tmp_path), "outputs/shards/link.jsonl#1", "d0")


def test_a_disk_that_refuses_the_shard_is_an_outputs_error_naming_it(tmp_path: Path) -> None:
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "shards").write_text("a file where the folder goes")
    writer = ShardWriter(str(tmp_path), "a1-w0")
    with pytest.raises(OutputsError, match="could not be written to .*shards/a1-w0-000001"):
        writer.write([{"id": "d0", "status": "accepted", "output": {"v": 1}}])
