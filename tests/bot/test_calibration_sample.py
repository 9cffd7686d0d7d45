"""An SSH pilot's calibration runs on its node (bot/dispatch/calibration_sample.py): the
volume's corpus where the node holds it, else a sample the bot draws with the run's seed
and sends with the pilot, never fetched back."""

from __future__ import annotations

from pathlib import Path

import pytest

import runner
from bot.dispatch import calibration_sample
from bot.dispatch.base import RunHandle
from bot.dispatch.bot_records import fetched_name
from bot.dispatch.calibration_sample import SAMPLE_DIR, calibration_copy
from bot.dispatch.inputs_check import record_inputs
from bot.dispatch.upload import UploadPlan
from bot.manifest.load import load_manifest_file
from bot.pilot.plan import make_plan
from bot.pilot.specbuild import build_spec
from runner.inputs import list_dir
from runner.spec import CalibrationSpec, draw_sample
from tests.bot.fakes import write_manifest

PACKAGE = Path(runner.__file__).resolve().parent


def pilot_upload(root: Path, corpus_dir: str = "data/corpus", docs: int = 200) -> UploadPlan:
    """The upload of a pilot whose volume's corpus of ``docs`` documents lies in the
    project folder (``corpus_dir``)."""
    run_dir = root / "runs" / "p1"
    run_dir.mkdir(parents=True)
    project = root / "project"
    corpus = project / corpus_dir
    corpus.mkdir(parents=True, exist_ok=True)
    for n in range(docs):
        (corpus / f"doc-{n:04d}.txt").write_text("x" * (100 + n), encoding="utf-8")
    manifest = write_manifest(project, extra=f"volume: {{batch_size: 2, inputs: {{dir: "
                                             f"{corpus_dir}, pattern: 'doc-*.txt', "
                                             f"expected_count: {docs}}}}}")
    loaded = load_manifest_file(manifest)
    spec = build_spec(loaded, make_plan(loaded), "p1").to_dict()
    assert spec["calibration"] is not None
    record_inputs(run_dir, str(spec["inputs"]["dir"]), str(spec["inputs"]["pattern"]))
    return UploadPlan("/w", RunHandle("p1", run_dir, run_dir / "spec.json", project),
                      PACKAGE, spec)


def test_a_corpus_left_out_of_the_pilots_upload_is_sampled_here_and_sent(
        tmp_path: Path) -> None:
    upload = pilot_upload(tmp_path)
    remote = f"{upload.remote_run_dir}/{SAMPLE_DIR}"
    (sample,) = [tree for _kind, root, tree in upload.trees() if root == remote]
    cal = upload.rewrite_spec()["calibration"]
    corpus = tmp_path / "project" / "data" / "corpus"
    files = list_dir(str(corpus), "doc-*.txt")
    spec = CalibrationSpec(**{k: v for k, v in cal.items() if k in ("batch_size", "seed",
                                                                     "batches_max")})
    # the node's own rule, drawn here with the run's seed: the node gets exactly that
    drawn = draw_sample(files, spec.seed, spec.sample_size(4))
    assert set(sample) == {Path(f.path).name for f in drawn} and len(sample) < 200
    assert (cal["dir"], cal["listed"], cal["drawn_on"]) == (remote, 200, "the bot host")
    assert cal["listed_bytes"] == sum(f.size for f in files)
    assert remote in upload.remote_dirs()
    # the pilot's project still goes without the corpus; the sample is never fetched back
    (project,) = [tree for _k, root, tree in upload.trees() if root == upload.remote_project]
    assert not [rel for rel in project if rel.startswith("data/corpus/")]
    assert not fetched_name(SAMPLE_DIR)


def test_a_large_sample_is_cut_to_the_batches_the_calibration_needs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(calibration_sample, "SAMPLE_MAX_BYTES", 1)
    upload = pilot_upload(tmp_path)
    (sample,) = [tree for _kind, root, tree in upload.trees() if root.endswith(SAMPLE_DIR)]
    cal = upload.rewrite_spec()["calibration"]
    # its least: `batches` batches and a warm-up batch per (CPU) worker
    assert len(sample) == cal["batch_size"] * (cal["batches"] + 4)


def test_a_corpus_the_upload_carries_is_sampled_at_its_path_on_the_node(
        tmp_path: Path) -> None:
    upload = pilot_upload(tmp_path, corpus_dir="data/pilote/all")  # inside the pilot's inputs
    assert not [root for _k, root, _t in upload.trees() if root.endswith(SAMPLE_DIR)]
    cal = upload.rewrite_spec()["calibration"]
    assert cal["dir"] == f"{upload.remote_project}/data/pilote/all"
    assert "listed" not in cal or not cal["listed"]


def test_a_corpus_on_the_nodes_is_sampled_there_and_nothing_is_sent() -> None:
    spec = {"calibration": {"dir": "/bot/side/corpus", "batch_size": 4}}
    copy = calibration_copy(spec, "/srv/corpus", "/w/runs/p1", lambda _p: None)
    assert copy is not None and copy.calibration["dir"] == "/srv/corpus"
    assert copy.remote is None and not copy.files
    assert calibration_copy({"calibration": None}, None, "/w/runs/p1", lambda _p: None) is None


def test_a_corpus_the_bot_cannot_list_is_left_to_the_nodes_own_listing(
        tmp_path: Path) -> None:
    spec = {"calibration": {"dir": str(tmp_path / "gone"), "batch_size": 4}}
    copy = calibration_copy(spec, None, "/w/runs/p1", lambda _p: None)
    assert copy is not None and copy.calibration == spec["calibration"] and not copy.files
