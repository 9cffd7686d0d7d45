"""The ``calibrate`` stage on a local Ray: a sample of the volume's inputs at the volume's
batch size, one warm-up call per worker timed apart, recorded into scratch files only."""

from __future__ import annotations

import json
from pathlib import Path

from runner.ledger import Ledger, ledger_path
from tests.runner.test_stages_kit import events_of, outcomes, run_runner, write_spec

SLOWSTART = '''
import time

_loaded = []


def handle(items, ctx):
    if not _loaded:          # the first call of each worker pays a warm-up
        time.sleep(0.3)
        _loaded.append(1)
    time.sleep(0.02)         # a fixed cost per batch
    return [{"id": i.id, "status": "accepted", "category": "short"} for i in items]
'''


def _corpus(project: Path, count: int) -> Path:
    corpus = project / "corpus"
    corpus.mkdir(parents=True, exist_ok=True)
    for k in range(count):
        (corpus / f"v{k:03d}.txt").write_text("x" * (10 + k))
    return corpus


def test_calibration_times_a_sample_at_the_volume_batch_size_apart_from_the_run(
        tmp_path: Path) -> None:
    project = tmp_path / "project"
    corpus = _corpus(project, 60)
    (project / "slowstart.py").write_text(SLOWSTART)
    spec = write_spec(tmp_path, task={"handler": "slowstart:handle", "batch_size": 2},
                      calibration={"dir": str(corpus), "pattern": "*.txt", "batch_size": 4,
                                   "batches": 5, "batches_max": 6, "min_s": 0, "seed": 7})
    run_dir = tmp_path / "runs" / "r1"
    done = run_runner(spec, run_dir, "--stages", "pilot,calibrate", timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    events = events_of(run_dir)
    end = outcomes(events)["calibrate"]
    assert end.type == "stage.passed", end.data
    facts = end.data["facts"]
    assert facts["batch_size"] == 4 and facts["listed"] == 60 and facts["seed"] == 7
    assert 5 <= len(facts["batches"]) <= 6
    assert all(b["items"] == 4 and b["seconds"] > 0 for b in facts["batches"])
    # one warm-up call per worker, timed apart: the warm-up is not in the batches
    assert len(facts["warmup"]) == facts["workers"] >= 1
    assert min(w["seconds"] for w in facts["warmup"]) >= 0.3
    assert max(b["seconds"] for b in facts["batches"]) < 0.3
    assert facts["ray_start_s"] > 0 and facts["workers_ready_s"] >= facts["ray_start_s"]
    sample = facts["sample_ids"] + facts["warmup_ids"]
    assert len(sample) == len(set(sample)) and set(sample) <= {f"v{k:03d}" for k in range(60)}
    assert facts["record_items"] == len(sample) and facts["record_s"] >= 0
    # batches this fast: 60 more through the volume's own Driver, timed (its pace)
    assert facts["pace"]["batches"] == 60 and facts["pace"]["wall_s"] > 0
    # the run's ledger and events hold the pilot's items only, never the sample's
    ids = {e.data["id"] for e in events if e.type == "item.done"}
    assert ids == {"a1", "a2", "a3"}
    with Ledger.open(ledger_path(str(run_dir))) as ledger:
        assert {row.id for row in ledger.rows()} == ids
    with Ledger.open(str(run_dir / "calibration" / "ledger.sqlite")) as scratch:
        assert {row.id for row in scratch.rows()} == set(sample)
    assert not (run_dir / "ray-session.json").exists() or json.loads(
        (run_dir / "ray-session.json").read_text())


def test_a_volume_corpus_the_node_cannot_list_skips_the_calibration(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, calibration={"dir": str(tmp_path / "nowhere"),
                                             "batch_size": 4})
    run_dir = tmp_path / "runs" / "r1"
    done = run_runner(spec, run_dir, "--stages", "calibrate", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    end = outcomes(events_of(run_dir))["calibrate"]
    assert end.type == "stage.skipped"
    assert "cannot be listed on this node" in end.data["reason"]


def test_a_run_without_a_calibration_has_no_calibrate_stage(tmp_path: Path) -> None:
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "runs" / "r1"
    done = run_runner(spec, run_dir, "--stages", "calibrate,evidence", timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "calibrate" not in {e.data.get("stage") for e in events_of(run_dir)}


def test_a_small_volume_runs_its_inputs_again_in_whole_batches(tmp_path: Path) -> None:
    """The least of batches always: a volume smaller than the calibration needs runs its
    inputs again, each timed batch a full one of the volume's size."""
    from runner.inputs import Item
    from runner.spec import CalibrationSpec, InputsSpec, RunSpec
    from runner.stage import StageContext
    from runner.stages.calibrate import _Calibration

    spec = RunSpec(run_id="r", name="n", inputs=InputsSpec(dir=str(tmp_path)))
    ctx = StageContext(spec=spec, run_dir=str(tmp_path))
    files = [Item(f"v{k:02d}", str(tmp_path / f"v{k:02d}"), 1) for k in range(10)]
    cal = _Calibration(ctx, CalibrationSpec(batch_size=4, seed=1), files, 4)
    sizes = [len(cal.take() or []), len(cal.take() or [])]           # two warm-up calls
    assert sizes == [4, 4] and cal.take(whole=True) is None           # 2 left: not a batch
    again = [cal.take(again=True, whole=True) for _ in range(3)]
    assert all(b is not None and len(b) == 4 and len({i.id for i in b}) == 4 for b in again)
    assert cal.facts["reused"] is True
    cal.close_scratch()
    tiny = _Calibration(ctx, CalibrationSpec(batch_size=4, seed=1), files[:3], 4)
    assert len(tiny.take() or []) == 3 and tiny.take() is None
    assert len(tiny.take(again=True) or []) == 3
    tiny.close_scratch()


def test_a_sample_the_bot_drew_is_reported_as_drawn_from_the_whole_corpus(
        tmp_path: Path) -> None:
    """A corpus the node does not hold: the bot sent a sample of it (its listing's count
    and bytes in the spec); the facts say the corpus's size and where it was drawn."""
    from runner.inputs import Item
    from runner.spec import CalibrationSpec, InputsSpec, RunSpec, draw_sample
    from runner.stage import StageContext
    from runner.stages.calibrate import CPU_WORKERS_MAX, _Calibration

    spec = RunSpec(run_id="r", name="n", inputs=InputsSpec(dir=str(tmp_path)))
    ctx = StageContext(spec=spec, run_dir=str(tmp_path))
    sent = [Item(f"v{k:02d}", str(tmp_path / f"v{k:02d}"), 10) for k in range(12)]
    given = CalibrationSpec(batch_size=4, seed=3, listed=5000, listed_bytes=123_456,
                            drawn_on="the bot host")
    cal = _Calibration(ctx, given, sent, 4)
    assert (cal.facts["listed"], cal.facts["listed_bytes"]) == (5000, 123_456)
    assert (cal.facts["drawn_on"], cal.facts["sample_sent"]) == ("the bot host", 12)
    assert cal.facts["sample_sent_bytes"] == 120
    # the node draws its own with the same rule: here the sample sent, every input of it
    assert {i.id for i in cal.sample} == {i.id for i in sent}
    assert cal.sample == draw_sample(sent, 3, given.sample_size(CPU_WORKERS_MAX))
    cal.close_scratch()
    own = _Calibration(ctx, CalibrationSpec(batch_size=4, seed=3), sent, 4)
    assert own.facts["listed"] == 12 and "drawn_on" not in own.facts
    own.close_scratch()
