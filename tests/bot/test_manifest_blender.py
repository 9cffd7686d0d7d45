"""The manifest of a render pilot: inputs.frames, the blender section, and their rules,
each error naming its field path and line; the spec the runner gets from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bot.pilot.plan import make_plan
from bot.pilot.specbuild import build_spec
from tests.bot.manifest_helpers import dump, load, locs, merged

BLENDER: dict[str, Any] = {
    "preparation": "blender",
    "inputs": {"dir": "shots", "pattern": "*.blend", "frames": "1-3", "expected_count": 6,
               "expected_refusals": ["shot02.blend#0002"]},
    "task": {"handler": None, "categories": None},
    "success": {"min_accepted": 5, "max_refused": 1},
    "blender": {"version": ">=3.4", "addons": ["node_wrangler"],
                "licenses": [{"name": "render farm", "env": "RLM_LICENSE"},
                             {"tcp": "licenses.studio.lan:5053"}]},
}


def project(root: Path) -> Path:
    shots = root / "shots"
    shots.mkdir()
    for name in ("shot01.blend", "shot02.blend"):
        (shots / name).write_bytes(b"BLENDER-v304")
    return root


def render(**change: Any) -> str:
    data = merged(**BLENDER)
    for key, value in change.items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
            data[key] = {k: v for k, v in data[key].items() if v is not None}
        elif value is None:
            data.pop(key, None)
        else:
            data[key] = value
    return dump(data)


def test_a_render_manifest_expects_one_id_per_frame_and_builds_the_spec(tmp_path: Path) -> None:
    loaded = load(project(tmp_path), render())
    ids = [f.id for f in loaded.input_files()]
    assert ids == [f"shot0{s}.blend#000{f}" for s in (1, 2) for f in (1, 2, 3)]
    spec = build_spec(loaded, make_plan(loaded), "r1")
    assert spec.preparation == "blender"
    assert spec.inputs.frames == "1-3"
    assert spec.task.categories == ["rendered"]
    assert spec.blender.version == ">=3.4"
    assert spec.blender.licenses == [{"name": "render farm", "env": "RLM_LICENSE"},
                                     {"tcp": "licenses.studio.lan:5053"}]


def test_the_volume_renders_its_own_frames_through_the_same_spec(tmp_path: Path) -> None:
    from bot.pilot.prechecks import expected_inputs

    volume = {"inputs": {"dir": "shots", "pattern": "*.blend", "frames": "1-24",
                         "expected_count": 48}}
    loaded = load(project(tmp_path), render(volume=volume))
    assert loaded.manifest.volume is not None
    vol_inputs = loaded.manifest.volume.inputs
    ids = expected_inputs(loaded, vol_inputs)
    assert len(ids) == 48 and ids[-1] == "shot02.blend#0024"
    spec = build_spec(loaded, make_plan(loaded), "v1", inputs=vol_inputs, kind="volume")
    assert (spec.inputs.frames, spec.inputs.expected_count) == ("1-24", 48)
    assert spec.preparation == "blender" and spec.task.categories == ["rendered"]
    missing = locs(tmp_path, render(volume={"inputs": {"dir": "shots", "expected_count": 2}}))
    assert "give the volume's frames too" in missing["volume.inputs.frames"].message


REFUSED: list[tuple[str, dict[str, Any], str, str]] = [
    ("frames missing", {"inputs": {"frames": None}}, "inputs.frames", "give inputs.frames"),
    ("frames backwards", {"inputs": {"frames": "9-1"}}, "inputs.frames",
     "ends before it starts"),
    ("frame twice", {"inputs": {"frames": [1, 2, 2]}}, "inputs.frames",
     "frame 2 is listed more than once"),
    ("count of frames", {"inputs": {"expected_count": 4}}, "inputs.expected_count",
     "expected 4 input frames ('1-3' of each file), found 6"),
    ("refusal not a frame", {"inputs": {"expected_refusals": ["shot02.blend#0009"]}},
     "inputs.expected_refusals[0]", "no input with id"),
    ("handler", {"task": {"handler": "runner.workloads.classify:handle"}}, "task.handler",
     "renders the frames itself"),
    ("other category", {"task": {"categories": ["cats"]}}, "task.categories",
     "leave task.categories out or write [rendered]"),
    ("version", {"blender": {"version": "3.6"}}, "blender.version",
     "version constraint"),
    ("licence with two kinds", {"blender": {"licenses": [{"env": "A", "file": "/x"}]}},
     "blender.licenses[0]", "exactly one of env, file or tcp (found env, file)"),
    ("licence address", {"blender": {"licenses": [{"tcp": "no port"}]}},
     "blender.licenses[0].tcp", "pattern"),
    ("cycles device of another vendor", {"blender": {"cycles_device": "HIP"}},
     "blender.cycles_device", "does not run on backend cuda"),
    ("resolution", {"blender": {"resolution": [64]}}, "blender.resolution", "at least 2"),
    ("unknown key", {"blender": {"sample": 4}}, "blender.sample", "did you mean 'samples'"),
]


@pytest.mark.parametrize("label, change, loc, fragment", REFUSED, ids=[r[0] for r in REFUSED])
def test_render_rules_name_the_field_and_line(tmp_path: Path, label: str,
                                             change: dict[str, Any], loc: str,
                                             fragment: str) -> None:
    found = locs(project(tmp_path), render(**change))
    assert loc in found, f"{label}: {sorted(found)}"
    assert fragment.lower() in found[loc].message.lower(), found[loc].message
    assert found[loc].line is not None


def test_frames_without_the_blender_preparation_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "data" / "pilote").mkdir(parents=True)
    text = dump(merged(inputs={"frames": "1-2"}, blender={"samples": 2}))
    found = locs(tmp_path, text)
    assert "inputs.frames is for preparation: blender" in found["inputs.frames"].message


def test_the_blender_section_elsewhere_is_a_warning(tmp_path: Path) -> None:
    data = tmp_path / "data" / "pilote"
    data.mkdir(parents=True)
    for i in range(1, 13):
        (data / f"doc-{i:02d}.txt").write_text("x")
    loaded = load(tmp_path, dump(merged(blender={"samples": 2})))
    assert [w.loc for w in loaded.warnings] == ["blender"]
    assert "used only with preparation: blender" in loaded.warnings[0].message


def test_the_shipped_example_is_valid() -> None:
    from bot.manifest.load import load_manifest_file

    repo = Path(__file__).resolve().parents[2]
    loaded = load_manifest_file(repo / "manifests" / "blender-pilote.yaml")
    assert [f.id for f in loaded.input_files()][0] == "shot01.blend#0001"
    assert loaded.warnings == []
    assert "peak from Cycles' log" in " ".join(make_plan(loaded).notes)
