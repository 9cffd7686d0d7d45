"""The forecast in the terminal with the real runner: shown with the verdict, a volume past
the lease refused without --override and recorded with it, the actual time after."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.e2e.test_pilot_cli import preflight, project

# The lease, the override and the forecast's score are tested here; the calibration has its
# own tests (tests/runner/test_calibrate.py, bench/forecast.py): one Ray start less.
PAST_LEASE = """volume:
  inputs: {dir: data/pilote, pattern: "doc-*.txt", expected_count: 12}
  calibrate: false
lease:
  starts_at: "2020-01-01T00:00:00Z"
"""


def test_a_volume_past_the_lease_in_the_terminal(tmp_path: Path) -> None:
    root = project(tmp_path)
    manifest = root / "manifests" / "pilote.yaml"
    manifest.write_text(manifest.read_text() + PAST_LEASE)
    done = preflight(root, "run", "manifests/pilote.yaml")
    assert done.returncode == 0, done.stderr
    assert "Forecast of the volume" in done.stdout and "AFTER the lease" in done.stdout
    run_id = json.loads(preflight(root, "runs", "--json").stdout)[0]["id"]
    fc = json.loads(preflight(root, "show", run_id, "--json").stdout)["forecast"]
    # the real runner's measurements: 11 accepted items, each with its time and size
    assert fc["possible"] and fc["samples"] == 11 and fc["fits"] is False
    assert fc["volume_count"] == 12
    refused = preflight(root, "decide", run_id, "approve", "--reason", "clean", "--by", "alice")
    assert refused.returncode == 1 and "after the lease ends" in refused.stderr
    ok = preflight(root, "decide", run_id, "approve", "--reason", "lease extended",
                   "--by", "alice", "--override")
    assert ok.returncode == 0, ok.stderr
    shown = json.loads(preflight(root, "show", run_id, "--json").stdout)
    assert [(d["accepted"], d["override"]) for d in shown["decisions"]] == [(0, 0), (1, 1)]
    assert "after the lease" in shown["decisions"][1]["override_of"]
    volume_id = next(r["id"] for r in json.loads(preflight(root, "runs", "--json").stdout)
                     if r["kind"] == "volume")
    volume = json.loads(preflight(root, "show", volume_id, "--json").stdout)
    check = volume["forecast"]
    # scored on the volume's work stage: one Ray start + the processing of its 12 items
    assert check["actual_s"] > 0 and check["attempts"] == 1 and check["scored"] == "whole"
    assert check["forecast_mid_s"] == round(fc["ray_start_s"] + fc["proc_mid_s"], 3)
    # the forecast counted the workers the volume started (CPU: one per core, at most 4)
    events = [json.loads(line) for line in
              (Path(volume["run_dir"]) / "events.jsonl").read_text().splitlines()]
    started = next(e for e in events if e["type"] == "volume.workers")["workers"]
    assert fc["workers"] == len(started) == min(4, os.cpu_count() or 1)
    assert check["workers_started"] == check["workers_forecast"] == fc["workers"]
    assert "Forecast against the actual" in ok.stdout
    # `preflight report` rewrites the report (now with both decisions) and prints its path
    written = preflight(root, "report", run_id[:22])
    assert written.returncode == 0, written.stderr
    path = Path(written.stdout.splitlines()[0])
    assert path == Path(shown["run_dir"]) / "report.html"
    text = path.read_text(encoding="utf-8")
    assert "REFUSED" in text and "lease extended" in text and "<svg" in text
    evidence = Path(shown["evidence"]["dest"])
    assert (evidence / "report.html").read_text(encoding="utf-8") == text
    assert preflight(root, "verify", str(evidence)).returncode == 0
    volume_report = Path(volume["run_dir"]) / "report.html"
    volume_text = volume_report.read_text(encoding="utf-8")
    assert "Forecast against the actual" in volume_text and "The pilot's forecast" in volume_text
    assert preflight(root, "report", "no-such-run").returncode == 2
    # `preflight outputs`: where the volume's outputs lie (the example handler returns its
    # outputs: its workers wrote them in a shard per batch), and one input's by its id
    place = preflight(root, "outputs", volume_id)
    assert place.returncode == 0, place.stderr
    assert f"outputs of run {volume_id}: {volume['run_dir']}/outputs" in place.stdout
    assert "files:  0 (0 B)" in place.stdout and "shards: 0" not in place.stdout
    one = preflight(root, "outputs", volume_id, "doc-04")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["category"] == "research"
    assert "doc-04: accepted; output outputs/shards/a1-w" in one.stderr
    refused = preflight(root, "outputs", volume_id, "doc-07")
    assert refused.returncode == 0 and "no output: it was refused" in refused.stderr
    assert preflight(root, "outputs", volume_id, "doc-99").returncode == 2
