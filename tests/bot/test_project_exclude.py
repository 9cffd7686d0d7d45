"""``project.exclude``: what the manifest leaves out of the project is never sent to an ssh
node nor read to be hashed (a 3,000-file corpus or checkpoints beside the code)."""

from __future__ import annotations

from pathlib import Path

import runner
from bot.dispatch.base import RunHandle
from bot.dispatch.inputs_check import record_inputs
from bot.dispatch.upload import UploadPlan
from bot.manifest.load import load_manifest_file
from bot.pilot.plan import make_plan
from bot.pilot.specbuild import build_spec
from tests.bot.fakes import write_manifest

PACKAGE = Path(runner.__file__).resolve().parent


def project_tree(root: Path) -> dict[str, str]:
    """What the upload would send of the project (relative path -> local path)."""
    run_dir = root / "runs" / "r1"
    run_dir.mkdir(parents=True)
    project = root / "project"
    manifest = write_manifest(project, extra="project: {exclude: [data/corpus, ckpt/last.pt]}")
    for rel in ("data/corpus/doc-0001.txt", "data/corpus/sub/doc-0002.txt", "ckpt/last.pt",
                "ckpt/best.pt", "src/model.py"):
        (project / rel).parent.mkdir(parents=True, exist_ok=True)
        (project / rel).write_text(rel + "\n", encoding="utf-8")
    loaded = load_manifest_file(manifest)
    spec = build_spec(loaded, make_plan(loaded), "r1").to_dict()
    record_inputs(run_dir, str(spec["inputs"]["dir"]), str(spec["inputs"]["pattern"]))
    upload = UploadPlan("/w", RunHandle("r1", run_dir, run_dir / "spec.json", project),
                        PACKAGE, spec)
    (tree,) = [local for kind, root_, local in upload.trees()
               if kind == "project" and root_ == upload.remote_project]
    return {rel: str(path) for rel, (path, _digest) in tree.items()}


def test_what_the_manifest_excludes_is_not_sent(tmp_path: Path) -> None:
    sent = project_tree(tmp_path)
    assert "src/model.py" in sent and "ckpt/best.pt" in sent
    assert "data/pilote/doc-01.txt" in sent  # the inputs still go
    assert not [rel for rel in sent if rel.startswith("data/corpus/")]
    assert "ckpt/last.pt" not in sent
