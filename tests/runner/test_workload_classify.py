from __future__ import annotations

import warnings
from pathlib import Path

from runner.inputs import Item, list_dir
from runner.spec import RunSpec
from runner.workloads import WorkloadContext, load_handler

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # this torch build warns that numpy is absent
    import torch  # noqa: F401

REPO = Path(__file__).resolve().parents[2]
CATEGORIES = ["invoice", "contract", "support", "research"]
# What a reader chooses for each document (written to be unambiguous).
EXPECTED = {
    "doc-01": "invoice", "doc-02": "contract", "doc-03": "support", "doc-04": "research",
    "doc-05": "invoice", "doc-06": "contract", "doc-08": "support", "doc-09": "research",
    "doc-10": "invoice", "doc-11": "contract", "doc-12": "research",
}


def spec() -> RunSpec:
    return RunSpec.from_dict({
        "run_id": "r", "name": "n",
        "inputs": {"dir": str(REPO / "data/pilote"), "pattern": "doc-*.txt"},
        "task": {"handler": "runner.workloads.classify:handle", "categories": CATEGORIES}})


def run(items: list[Item], out: Path) -> dict[str, dict]:
    handle = load_handler(spec())
    results = handle(items, WorkloadContext(spec=spec(), device="cpu", outputs_dir=str(out)))
    assert [r["id"] for r in results] == [i.id for i in items]
    return {r["id"]: r for r in results}


def test_each_valid_document_gets_the_category_a_reader_would_choose(tmp_path: Path) -> None:
    res = run(list_dir(str(REPO / "data/pilote"), "doc-*.txt"), tmp_path)
    got = {i: r["category"] for i, r in res.items() if r["status"] == "accepted"}
    assert got == EXPECTED
    assert res["doc-07"]["status"] == "refused"
    assert "not valid UTF-8" in res["doc-07"]["reason"]
    out = res["doc-04"]["output"]  # returned for the runner to write (a file or a shard line)
    assert out["category"] == "research" and set(out["scores"]) == set(CATEGORIES)
    assert out["id"] == "doc-04" and out["chars"] > 0 and out["words"] > 0
    assert "output" not in res["doc-07"]
    assert sorted(i for i, r in res.items() if "output" in r) == sorted(EXPECTED)
    assert list(tmp_path.iterdir()) == []  # the handler writes nothing itself


def test_the_answer_is_deterministic_and_independent_of_batching(tmp_path: Path) -> None:
    items = list_dir(str(REPO / "data/pilote"), "doc-*.txt")
    whole = run(items, tmp_path / "a")
    single = {}
    for it in items:
        single.update(run([it], tmp_path / "b"))
    assert whole == single  # outputs included


def test_empty_binary_unreadable_and_wordless_inputs_are_refused_with_a_reason(
        tmp_path: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    (src / "empty.txt").write_bytes(b"  \n")
    (src / "bin.txt").write_bytes(b"abc\x00def")
    (src / "nums.txt").write_text("12 34 56 -- ##")
    items = list_dir(str(src)) + [Item("gone", str(src / "gone.txt"), 0)]
    res = run(items, tmp_path / "out")
    assert res["empty"]["reason"] == "empty input"
    assert res["bin"]["reason"].startswith("not text")
    assert res["nums"]["reason"].startswith("no recognisable content")
    assert res["gone"]["reason"].startswith("unreadable")
    assert all(r["status"] == "refused" for r in res.values())
