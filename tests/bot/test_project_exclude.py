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


def upload_of(root: Path, kind: str) -> UploadPlan:
    """The upload of a pilot (``kind`` "pilot") or of its volume, whose corpus of 30
    documents lies in the project folder beside the pilot's inputs."""
    run_dir = root / "runs" / kind
    run_dir.mkdir(parents=True)
    project = root / "project"
    corpus = project / "data" / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for n in range(30):
        (corpus / f"doc-{n:04d}.txt").write_text(f"invoice {n}", encoding="utf-8")
    manifest = write_manifest(project, extra="volume: {inputs: {dir: data/corpus, "
                                             "pattern: 'doc-*.txt', expected_count: 30}}")
    loaded = load_manifest_file(manifest)
    assert loaded.manifest.volume is not None
    inputs = loaded.manifest.volume.inputs if kind == "volume" else None
    spec = build_spec(loaded, make_plan(loaded), kind, inputs=inputs, kind=kind).to_dict()
    record_inputs(run_dir, str(spec["inputs"]["dir"]), str(spec["inputs"]["pattern"]))
    return UploadPlan("/w", RunHandle(kind, run_dir, run_dir / "spec.json", project),
                      PACKAGE, spec)


def test_a_pilot_sends_its_inputs_and_code_not_the_volume_s_corpus(tmp_path: Path) -> None:
    pilot = upload_of(tmp_path / "p", "pilot")
    (tree,) = [local for kind, root_, local in pilot.trees() if root_ == pilot.remote_project]
    assert "data/pilote/doc-01.txt" in tree
    assert not [rel for rel in tree if rel.startswith("data/corpus/")]
    # the node keeps a corpus an earlier volume sent: neither hashed nor removed there
    assert f"{pilot.remote_project}/data/corpus" in pilot.excluded()
    volume = upload_of(tmp_path / "v", "volume")
    (tree,) = [local for kind, root_, local in volume.trees() if root_ == volume.remote_project]
    assert len([rel for rel in tree if rel.startswith("data/corpus/")]) == 30
    assert not [p for p in volume.excluded() if p.endswith("/data/corpus")]
