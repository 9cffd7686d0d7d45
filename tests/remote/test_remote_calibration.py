"""An SSH pilot's volume is calibrated on its node (issue 36, point 1), through a real sshd:
the corpus lies beside the pilot's inputs on the bot host and is left out of the pilot's
upload, so the bot sends a sample of it, drawn with the run's seed; the node's calibrate
stage times it and the forecast rests on it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from bot.dispatch.calibration_sample import SAMPLE_DIR
from bot.dispatch.upload import RUNNER_PACKAGE
from tests.remote.remote_kit import provisioned_bot, remote_events, start_run, write_project
from tests.remote.sshd_server import Sshd


def test_an_ssh_pilot_calibrates_on_its_node_a_sample_the_bot_sent(tmp_path: Path,
                                                                   sshd: Sshd) -> None:
    workdir = tmp_path / "node"
    node = {"kind": "ssh", "host": "127.0.0.1", "port": sshd.port, "user": sshd.user,
            "workdir": str(workdir), "python": sys.executable}
    project = tmp_path / "project"
    manifest = write_project(project, node)
    corpus = project / "data" / "corpus"
    corpus.mkdir(parents=True)
    for n in range(300):
        (corpus / f"doc-{n:04d}.txt").write_text(f"invoice number {n} total due")
    data = json.loads(manifest.read_text(encoding="utf-8"))
    data["volume"] = {"batch_size": 2, "inputs": {"dir": "data/corpus", "pattern": "doc-*.txt",
                                                  "expected_count": 300}}
    manifest.write_text(json.dumps(data), encoding="utf-8")
    dispatcher = sshd.dispatcher(runner_package=RUNNER_PACKAGE)
    with provisioned_bot(tmp_path / "home", sshd, dispatcher) as bot:
        run_id = start_run(bot, manifest)
        run = bot.service.follower.follow(run_id, timeout=300)
        assert run["outcome"] == "passed", (run["first_error"], run["verdict"])
        remote_run = workdir / "runs" / run_id
        ends = {e["stage"]: e for e in remote_events(remote_run)
                if e["type"] in ("stage.passed", "stage.skipped", "stage.failed")}
        calibrate = ends["calibrate"]
        assert calibrate["type"] == "stage.passed", calibrate
        facts = calibrate["facts"]
        assert (facts["listed"], facts["drawn_on"]) == (300, "the bot host")
        assert 0 < facts["sample_sent"] < 300 and len(facts["batches"]) >= 5
        # the sample went to the run's folder on the node, the corpus never did
        sent = {p.name for p in (remote_run / SAMPLE_DIR).iterdir()}
        assert len(sent) == facts["sample_sent"]
        assert set(facts["sample_ids"]) <= {name.removesuffix(".txt") for name in sent}
        (copy,) = list((workdir / "projects").iterdir())
        assert not (copy / "data" / "corpus").exists()
        # nor does it come back with the results
        assert not (Path(run["run_dir"]) / SAMPLE_DIR).exists()
        # the forecast rests on that calibration, not on the pilot alone
        forecast = run.get("forecast")
        forecast = json.loads(forecast) if isinstance(forecast, str) else forecast
        assert isinstance(forecast, dict) and forecast.get("calibrated") is True, forecast
        calibration = next(f for f in forecast["figures"] if f["key"] == "calibration")
        assert "on the bot host and sent with the pilot" in calibration["formula"]
