"""From manifest to runner spec: every path resolved, every field carried."""

from __future__ import annotations

from pathlib import Path

from bot.manifest import load_manifest_file
from bot.plan import make_plan
from bot.specbuild import build_spec, runs_dir_for
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
