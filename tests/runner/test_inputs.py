from __future__ import annotations

from pathlib import Path

import pytest

from runner.inputs import InputsError, item_id, list_dir, list_inputs
from runner.spec import RunSpec

REPO = Path(__file__).resolve().parents[2]


def test_ids_are_file_names_without_final_extension_sorted(tmp_path: Path) -> None:
    for name in ("b.txt", "a.tar.gz", "c", ".hidden.txt"):
        (tmp_path / name).write_text("x")
    (tmp_path / "sub.txt").mkdir()
    items = list_dir(str(tmp_path))
    assert [i.id for i in items] == ["a.tar", "b", "c"]
    assert items[1].size == 1 and Path(items[1].path).is_absolute()
    assert item_id("doc-01.txt") == "doc-01"


def test_pattern_filters_and_two_files_with_one_id_are_named(tmp_path: Path) -> None:
    (tmp_path / "doc-1.txt").write_text("x")
    (tmp_path / "notes.md").write_text("x")
    assert [i.id for i in list_dir(str(tmp_path), "doc-*")] == ["doc-1"]
    (tmp_path / "doc-1.json").write_text("{}")
    with pytest.raises(InputsError, match=r"doc-1\.json and doc-1\.txt|doc-1\.txt and doc-1\.json"):
        list_dir(str(tmp_path), "doc-*")


def test_missing_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(InputsError, match="nope: cannot list"):
        list_dir(str(tmp_path / "nope"))


def test_the_pilot_documents_are_twelve_of_varied_length_with_one_invalid() -> None:
    spec = RunSpec.from_dict({"run_id": "r", "name": "n",
                              "inputs": {"dir": str(REPO / "data/pilote"), "pattern": "doc-*.txt"}})
    items = list_inputs(spec)
    assert [i.id for i in items] == [f"doc-{n:02d}" for n in range(1, 13)]
    sizes = sorted(i.size for i in items)
    assert sizes[0] < 200 and sizes[-1] > 4000  # a one-liner up to several KB
    invalid = []
    for it in items:
        try:
            Path(it.path).read_bytes().decode("utf-8")
        except UnicodeDecodeError:
            invalid.append(it.id)
    assert invalid == ["doc-07"]
