"""From manifest to runner spec: every path resolved, every field carried."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.errors import ManifestError
from bot.manifest.catalog import default_catalog
from bot.manifest.load import load_manifest_file
from bot.pilot.plan import make_plan
from bot.pilot.specbuild import build_spec, runs_dir_for
from runner.spec import RunSpec
from tests.bot.fakes import write_manifest


def test_spec_carries_the_manifest_with_paths_resolved(tmp_path: Path) -> None:
    extra = ("diagnostics: {timeouts: {compute: 30}, memory_budget_gib: 2, checks: [m:f]}\n"
             "project: {dir: ., params: {lr: 0.1}}")
    path = write_manifest(tmp_path, extra=extra, copy_to=True)
    text = path.read_text().replace("task: {kind: classify,", "task: {kind: classify, seed: 7,")
    path.write_text(text)
    loaded = load_manifest_file(path)
    spec = build_spec(loaded, make_plan(loaded), "r1")
    assert spec.inputs.dir == str((tmp_path / "data" / "pilote").resolve())
    assert spec.inputs.expected_count == 4 and spec.task.categories == ["invoice", "contract"]
    assert spec.results.copy_to == str((tmp_path / "evidence").resolve())
    assert spec.training.seed == 7 and spec.project.params == {"lr": 0.1}
    assert spec.diagnostics.timeouts == {"compute": 30} and spec.diagnostics.checks == ["m:f"]
    assert spec.diagnostics.memory_budget_gib == 2
    assert RunSpec.from_dict(spec.to_dict()) == spec  # what the runner reads back
    assert runs_dir_for(loaded, tmp_path / "default") == tmp_path / "default"


def test_spec_carries_the_trainer_and_older_specs_still_load(tmp_path: Path) -> None:
    path = write_manifest(tmp_path)
    text = path.read_text().replace("purpose: inference", "purpose: training").replace(
        "task: {kind: classify,", 'task: {kind: train, trainer: "team.train:Trainer",')
    path.write_text(text)
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "train.py").write_text("class Trainer:\n    pass\n")
    loaded = load_manifest_file(path)
    spec = build_spec(loaded, make_plan(loaded), "r1")
    assert spec.task.kind == "train" and spec.task.trainer == "team.train:Trainer"
    assert RunSpec.from_dict(spec.to_dict()) == spec
    raw = spec.to_dict()
    del raw["task"]["trainer"]  # a spec written before the field existed
    assert RunSpec.from_dict(raw).task.trainer is None


def test_trainer_outside_kind_train_is_a_warning_and_a_bad_reference_an_error(
        tmp_path: Path) -> None:
    path = write_manifest(tmp_path)
    path.write_text(path.read_text().replace("task: {kind: classify,",
                                             "task: {kind: classify, trainer: team.train,"))
    loaded = load_manifest_file(path)
    assert "only with kind: train" in {w.loc: w for w in loaded.warnings}["task.trainer"].message
    path.write_text(path.read_text().replace("trainer: team.train,", 'trainer: "team/train.py",'))
    with pytest.raises(ManifestError) as err:
        load_manifest_file(path)
    assert "task.trainer" in str(err.value)


def test_spec_carries_the_catalogs_per_card_peaks() -> None:
    repo = Path(__file__).resolve().parents[2]
    loaded = load_manifest_file(repo / "manifests" / "h100-pilote.yaml")
    spec = build_spec(loaded, make_plan(loaded), "r1")
    h100 = default_catalog().get("H100")
    assert h100 is not None and h100.bf16_tflops == 989 and h100.fp32_tflops == 67
    assert (spec.hardware.bf16_tflops, spec.hardware.fp32_tflops) == (989, 67)
    assert RunSpec.from_dict(spec.to_dict()).hardware.bf16_tflops == 989
    assert spec.hardware.bf16_floor_tflops == h100.bf16_floor_tflops == 500
    assert spec.hardware.allreduce_busbw_gbps == {"8": 480.0}
    assert spec.hardware.lots == loaded.manifest.hardware.lots
    assert spec.diagnostics.slow_card == "fail"
    again = RunSpec.from_dict(spec.to_dict())
    assert again.hardware.allreduce_busbw_gbps == {"8": 480.0}


def test_a_card_without_figures_gives_no_peak(tmp_path: Path) -> None:
    loaded = load_manifest_file(write_manifest(tmp_path))  # gpu: cpu
    spec = build_spec(loaded, make_plan(loaded), "r1")
    assert (spec.hardware.bf16_tflops, spec.hardware.fp32_tflops) == (None, None)


def test_each_node_of_a_ten_by_eight_rent_is_judged_on_its_eight_cards(tmp_path: Path) -> None:
    """80 cards rented (10 lots of 8) over the 10 nodes of volume.nodes: the pilot's node,
    the volume's head and each node's card proof expect 8, the node's share, not 80."""
    from bot.manifest.catalog import load_catalog
    from runner.cards import judge_count

    (tmp_path / "catalog.yaml").write_text(
        "gpus:\n  H100x8: {vendor: nvidia, memory_gib: 80, cards_per_lot: 8, "
        "backends: [cuda]}\n")
    catalog = load_catalog(tmp_path / "catalog.yaml")
    path = write_manifest(tmp_path, extra="volume:\n  inputs: {dir: data/pilote, "
                          "expected_count: 4}\n  nodes:\n"
                          + "".join(f"    - {{kind: ssh, host: gpu-{n}.example}}\n"
                                    for n in range(10)))
    text = path.read_text().replace(
        'hardware: {gpu: cpu, lots: 1, days: 3, lot_price_usd_per_day: "0"}',
        'hardware: {gpu: H100x8, lots: 10, days: 3, lot_price_usd_per_day: "10"}').replace(
        "backend: cpu", "backend: cuda")
    path.write_text(text)
    loaded = load_manifest_file(path, catalog=catalog)
    plan = make_plan(loaded, catalog)
    volume = loaded.manifest.volume
    assert volume is not None and plan.total_cards == 80
    for spec in (build_spec(loaded, plan, "p1"),
                 build_spec(loaded, plan, "v1", inputs=volume.inputs, kind="volume")):
        back = RunSpec.from_dict(spec.to_dict())  # what the runner reads
        assert (back.hardware.lots, back.hardware.cards_per_lot) == (10, 8)
        assert back.hardware.node_cards == 8 and back.hardware.expected_cards() == 8
        assert judge_count(8, back.hardware) == ("ok", None)  # the runner's device stage
        level, message = judge_count(7, back.hardware)
        assert level == "fail" and "7 card(s) visible, 8 rented on this node" in str(message)
    # the pilot measures with the threads of a volume worker holding 1 card (issue 37)
    assert build_spec(loaded, plan, "p1").task.worker_cards == 1


def test_a_pilot_without_volume_nodes_expects_the_whole_rent(tmp_path: Path) -> None:
    path = write_manifest(tmp_path)
    path.write_text(path.read_text().replace("gpu: cpu, lots: 1", "gpu: cpu, lots: 3"))
    loaded = load_manifest_file(path)
    assert build_spec(loaded, make_plan(loaded), "p1").hardware.node_cards == 3


def test_a_pilot_measures_with_a_cpu_volume_workers_threads(tmp_path: Path) -> None:
    """A CPU volume follows: the pilot's spec says so (worker_cards 0: one CPU a worker),
    and a pilot without a volume keeps its own cores (None) (issue 37)."""
    plain = load_manifest_file(write_manifest(tmp_path))
    assert build_spec(plain, make_plan(plain), "p1").task.worker_cards is None
    path = write_manifest(tmp_path, extra="volume: {inputs: {dir: data/pilote, "
                          "expected_count: 4}}")
    loaded = load_manifest_file(path)
    spec = build_spec(loaded, make_plan(loaded), "p1")
    assert spec.task.worker_cards == 0 and RunSpec.from_dict(spec.to_dict()) == spec
