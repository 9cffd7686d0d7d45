"""The loader: data, locations of problems, all problems at once, YAML and JSON."""

from __future__ import annotations

import json
import subprocess
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from bot.errors import ManifestError, ManifestUnreadable
from bot.manifest.load import load_manifest, load_manifest_file
from tests.bot.manifest_helpers import BASE, dump, load, locs, make_project, merged, problems

REPO = Path(__file__).resolve().parents[2]


def test_valid_manifest_loads_with_paths_and_inputs(tmp_path: Path) -> None:
    make_project(tmp_path)
    (tmp_path / "data" / "pilote" / ".DS_Store").write_text("x")
    loaded = load(tmp_path, dump(BASE))
    assert loaded.manifest.hardware.lot_price_usd_per_day == Decimal("2.50")
    assert loaded.project_dir == tmp_path.resolve()
    assert loaded.inputs_dir == (tmp_path / "data" / "pilote").resolve()
    ids = [f.id for f in loaded.input_files()]
    assert ids == [f"doc-{i:02d}" for i in range(1, 13)]
    assert loaded.warnings == []
    assert loaded.manifest.to_data()["apiVersion"] == "preflight/v1"


def test_shipped_example_manifests_are_valid() -> None:
    # demo.yaml's volume reads the corpus `make demo` writes (git-ignored): write it the same
    # way (deterministic, files already right are left alone) so a clean clone checks it too.
    subprocess.run([sys.executable, str(REPO / "data" / "make_corpus.py"),
                    str(REPO / "data" / "corpus"), "3000"], check=True, capture_output=True)
    for path in sorted((REPO / "manifests").glob("*.yaml")):
        loaded = load_manifest_file(path)
        assert loaded.source == str(path)
        assert len(loaded.input_files()) == loaded.manifest.inputs.expected_count


def test_error_names_path_line_and_column(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(hardware={"lots": 11}))
    problem = locs(tmp_path, text)["hardware.lots"]
    line = text.splitlines().index("  lots: 11") + 1
    assert (problem.line, problem.column) == (line, 3)
    assert "10" in problem.message and "found 11" in problem.message


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(hardware={"lots": 11, "days": 5, "gpu": "MI300X"},
                       inputs={"expected_count": 13, "expected_refusals": ["doc-99"]},
                       task={"categories": []}, name="Not A Slug"))
    found = locs(tmp_path, text)
    assert {"hardware.lots", "hardware.days", "backend", "inputs.expected_count",
            "inputs.expected_refusals[0]", "task.categories", "name"} <= set(found)
    assert all(p.line is not None for p in found.values())


def test_unknown_key_refused_with_suggestion(tmp_path: Path) -> None:
    make_project(tmp_path)
    data = merged()
    data["hardware"]["lotz"] = 2
    text = dump(data)
    problem = locs(tmp_path, text)["hardware.lotz"]
    assert "did you mean 'lots'" in problem.message
    assert problem.line == text.splitlines().index("  lotz: 2") + 1


def test_missing_key_points_at_parent_mapping(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(hardware={"days": None}))
    problem = locs(tmp_path, text)["hardware.days"]
    assert "missing" in problem.message
    assert problem.line == text.splitlines().index("hardware:") + 1


def test_missing_api_version(tmp_path: Path) -> None:
    make_project(tmp_path)
    problem = locs(tmp_path, dump(merged(apiVersion=None)))["apiVersion"]
    assert problem.line == 1


def test_json_manifest_with_tabs_has_lines(tmp_path: Path) -> None:
    make_project(tmp_path)
    data = merged(hardware={"days": 5})
    text = json.dumps(data, indent="\t")
    problem = locs(tmp_path, text)["hardware.days"]
    assert problem.line == next(
        i for i, line in enumerate(text.splitlines(), 1) if '"days"' in line)
    valid = load(tmp_path, json.dumps(BASE, indent="\t"))
    assert valid.manifest.hardware.days == 7


def test_price_keeps_the_text_as_written(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(BASE).replace("lot_price_usd_per_day: '2.50'", "lot_price_usd_per_day: 0.10")
    assert load(tmp_path, text).manifest.hardware.lot_price_usd_per_day == Decimal("0.10")


@pytest.mark.parametrize("text, fragment", [
    ("", "empty"),
    ("apiVersion: [unclosed\n", "not valid YAML"),
    ("- a\n- b\n", "expected a mapping"),
    ("a: &x [*x]\n", "refers to itself"),
    ("a: 1\na: 2\n", "duplicate key"),
    ("x: !!python/object:os.system {}\n", "not valid YAML"),
    ("a: 1\nb: !!int abc\n", "cannot be read as int"),
])
def test_unusable_documents_are_located(tmp_path: Path, text: str, fragment: str) -> None:
    with pytest.raises(ManifestError) as info:
        load_manifest(text, source="t", base_dir=tmp_path)
    assert any(fragment in p.message for p in info.value.problems)
    assert all(p.line is not None for p in info.value.problems)


def test_every_duplicate_key_is_reported_with_the_first_line(tmp_path: Path) -> None:
    text = "a: 1\nb:\n  c: 1\n  c: 2\na: 3\n"
    with pytest.raises(ManifestError) as info:
        load_manifest(text, source="t", base_dir=tmp_path)
    found = [(p.loc, p.line, p.column) for p in info.value.problems
             if "duplicate key" in p.message]
    assert found == [("b.c", 4, 3), ("a", 5, 1)]
    assert any("first at line 3" in p.message for p in info.value.problems if p.loc == "b.c")
    # ... beside the document's other problems (a and b are unknown keys), not instead
    assert len(info.value.problems) > 2


def test_a_repeated_empty_key_still_has_a_field_path(tmp_path: Path) -> None:
    # Found by the property test: anchors glued to keys leave two empty keys at the top.
    text = "&aapiVersion: preflight/v1\nname: pilot-test\n&ahardware:\n  gpu: H100\n"
    with pytest.raises(ManifestError) as info:
        load_manifest(text, source="t", base_dir=tmp_path)
    found = [(p.loc, p.line) for p in info.value.problems if "duplicate key" in p.message]
    assert found == [("''", 3)]


def test_alias_bomb_is_refused_quickly(tmp_path: Path) -> None:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, 9)]
    with pytest.raises(ManifestError) as info:
        load_manifest("\n".join(lines) + "\n", source="t", base_dir=tmp_path)
    assert "expand too far" in info.value.problems[0].message


def bomb_in_params(levels: int = 6) -> tuple[str, int]:
    """A valid manifest whose task.params hold a ~350-byte alias bomb (9 ** levels values),
    and the line of its fifth level."""
    lines = ["    a0: &a0 [" + ", ".join(["lol"] * 9) + "]"]
    lines += [f"    a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, levels)]
    text = dump(BASE).replace("task:\n", "task:\n  params:\n" + "\n".join(lines) + "\n", 1)
    return text, text.splitlines().index(lines[min(4, levels - 1)]) + 1


def test_a_small_alias_bomb_is_refused_naming_the_alias_line(tmp_path: Path) -> None:
    make_project(tmp_path)
    text, line = bomb_in_params()
    assert len("\n".join(t for t in text.splitlines() if t.startswith("    a"))) < 360
    with pytest.raises(ManifestError) as info:
        load_manifest(text, source="t", base_dir=tmp_path)
    (problem,) = info.value.problems
    assert "aliases expand too far" in problem.message and "10000 values" in problem.message
    assert problem.line == line


def test_a_few_aliases_are_still_fine_and_the_text_is_kept_as_posted(tmp_path: Path) -> None:
    make_project(tmp_path)
    text, _ = bomb_in_params(levels=3)
    loaded = load_manifest(text, source="t", base_dir=tmp_path)
    assert loaded.text == text
    assert len(loaded.manifest.task.params["a2"]) == 9


def test_too_many_aliases_are_refused(tmp_path: Path) -> None:
    text = "a: &a x\nb: [" + ", ".join(["*a"] * 101) + "]\n"
    with pytest.raises(ManifestError) as info:
        load_manifest(text, source="t", base_dir=tmp_path)
    assert "100 aliases" in info.value.problems[0].message
    assert info.value.problems[0].line == 2


def test_a_manifest_over_256_kib_is_refused_before_parsing(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(BASE) + "# " + "x" * (256 * 1024) + "\n"
    with pytest.raises(ManifestError) as info:
        load_manifest(text, source="t", base_dir=tmp_path)
    assert "more than the 256 KiB" in info.value.problems[0].message
    big = tmp_path / "big.yaml"
    big.write_text(text)
    with pytest.raises(ManifestError, match="256 KiB"):
        load_manifest_file(big)


def test_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ManifestUnreadable):
        load_manifest_file(tmp_path / "missing.yaml")
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")
    with pytest.raises(ManifestUnreadable) as info:
        load_manifest_file(bad)
    assert "UTF-8" in info.value.problems[0].message


def test_bad_timestamp_is_a_located_field_error(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(lease={"starts_at": "2024-05-01T09:00:00"}))
    assert "lease.starts_at" in locs(tmp_path, text)
    text = dump(BASE) + "lease:\n  starts_at: 2024-13-45\n"
    assert "lease.starts_at" in locs(tmp_path, text)
    ok = dump(BASE) + "lease:\n  starts_at: 2024-05-01T09:00:00Z\n"
    assert load(tmp_path, ok).manifest.lease.starts_at is not None


def test_command_string_is_split(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(task={"handler": None, "command": "python src/run.py --fast 'a b'"}))
    assert load(tmp_path, text).manifest.task.command == ["python", "src/run.py", "--fast", "a b"]


def test_warnings_do_not_refuse(tmp_path: Path) -> None:
    make_project(tmp_path)
    text = dump(merged(hardware={"memory_estimate_gib": 100},
                       node={"kind": "ssh", "host": "gpu.example.net"}))
    loaded = load(tmp_path, text)
    assert {w.loc for w in loaded.warnings} == {"hardware.memory_estimate_gib", "node.workdir"}
    assert all(w.severity == "warning" and w.line for w in loaded.warnings)


def test_errors_come_sorted_by_line(tmp_path: Path) -> None:
    make_project(tmp_path)
    found = problems(tmp_path, dump(merged(success={"min_accepted": 20}, hardware={"lots": 0})))
    lines = [p.line or 0 for p in found]
    assert lines == sorted(lines) and len(found) == 2
