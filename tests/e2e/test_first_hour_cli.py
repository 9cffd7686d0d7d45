"""The first hour in the terminal (issue 27): no mistake strands a pilot, and the terminal
says who, what and which command to type. One real pilot (with a volume) for the module."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_pilot_cli import preflight, project

# The first hour's words are tested here, not the calibration (tests/runner/test_calibrate.py,
# tests/e2e/test_demo_cli.py): one Ray start less per pilot.
VOLUME = """volume:
  inputs: {dir: corpus, pattern: "doc-*.txt", expected_count: 12}
  calibrate: false
"""
NO_USER = {"USER": "", "LOGNAME": ""}
Pilot = tuple[Path, str, subprocess.CompletedProcess[str]]


@pytest.fixture(scope="module")
def pilot(tmp_path_factory: pytest.TempPathFactory) -> Pilot:
    """A passed pilot awaiting its decision, whose volume is the 12 documents in corpus/."""
    root = project(tmp_path_factory.mktemp("first-hour"))
    shutil.copytree(root / "data" / "pilote", root / "corpus")
    manifest = root / "manifests" / "pilote.yaml"
    manifest.write_text(manifest.read_text() + VOLUME)
    done = preflight(root, "run", "manifests/pilote.yaml", env=NO_USER)
    assert done.returncode == 0, done.stdout + done.stderr
    run_id = preflight(root, "runs", "--json").stdout.split('"id": "')[1].split('"')[0]
    return root, run_id, done


def _no_traceback(done: subprocess.CompletedProcess[str]) -> None:
    assert "Traceback" not in done.stdout + done.stderr
    assert "internal error" not in done.stdout + done.stderr


def test_a_mistyped_volume_folder_is_an_error_before_the_pilot_runs(tmp_path: Path) -> None:
    root = project(tmp_path)
    manifest = root / "manifests" / "pilote.yaml"
    manifest.write_text(manifest.read_text() + VOLUME.replace("dir: corpus", "dir: corpsu"))
    checked = preflight(root, "validate", "manifests/pilote.yaml")
    assert checked.returncode == 1 and "volume.inputs.dir" in checked.stdout + checked.stderr
    done = preflight(root, "run", "manifests/pilote.yaml")
    assert done.returncode == 2, done.stdout + done.stderr
    said = "".join(done.stderr.split())  # the terminal wraps a long path anywhere
    assert "volume.inputs.dir" in said and "corpsuisnotadirectory" in said
    assert not (root / "runs").exists() or not any((root / "runs").iterdir())


def test_a_volume_folder_gone_at_approval_refuses_it_and_the_pilot_stays_approvable(
        pilot: Pilot) -> None:
    root, run_id, _ = pilot
    (root / "corpus").rename(root / "corpsu")
    try:
        done = preflight(root, "decide", run_id, "approve", "--reason", "clean", "--by", "alice")
        shown = preflight(root, "show", run_id)
        again = preflight(root, "decide", run_id, "approve", "--reason", "clean", "--by",
                          "alice")
    finally:
        (root / "corpsu").rename(root / "corpus")
    assert done.returncode == 1
    _no_traceback(done)
    assert "volume.inputs.dir" in done.stderr and "approve again" in " ".join(done.stderr.split())
    assert "Scale-up approved" not in done.stdout + shown.stdout
    assert "awaiting a decision" in shown.stdout or f"preflight decide {run_id}" in shown.stdout
    assert "already decided" not in again.stderr  # still approvable: refused for the same reason
    assert "volume.inputs.dir" in again.stderr


def test_a_mistyped_approver_gets_did_you_mean_and_where_the_list_is(pilot: Pilot) -> None:
    root, run_id, _ = pilot
    done = preflight(root, "decide", run_id, "approve", "--reason", "clean", "--by", "alcie")
    assert done.returncode == 1
    _no_traceback(done)
    text = " ".join(done.stderr.split())
    assert "did you mean 'alice'?" in text and "approvals.approvers" in text


def test_no_user_name_warns_and_decide_says_how_to_name_yourself(pilot: Pilot) -> None:
    root, run_id, ran = pilot
    assert "recorded as 'unknown'" in " ".join(ran.stderr.split())
    done = preflight(root, "decide", run_id, "approve", "--reason", "clean", env=NO_USER)
    assert done.returncode == 1
    text = " ".join(done.stderr.split())
    assert "unknown is not an approver" in text
    assert "--by NAME" in text and "PREFLIGHT_USER" in text


def test_run_decide_approve_with_a_volume_node_not_leased_is_refused_in_words(
        tmp_path: Path) -> None:
    root = project(tmp_path)
    manifest = root / "manifests" / "pilote.yaml"
    manifest.write_text(manifest.read_text() + VOLUME.replace("dir: corpus", "dir: data/pilote")
                        + "  nodes: [{kind: ssh, host: gpu-a.example, workdir: /srv/p}]\n")
    done = preflight(root, "run", "manifests/pilote.yaml", "--decide", "approve", "--reason",
                     "clean", "--by", "alice")
    assert done.returncode == 0, done.stdout + done.stderr  # the pilot passed
    _no_traceback(done)
    said = " ".join(done.stderr.split())
    assert "decision refused (recorded): the volume cannot be launched" in said
    assert "gpu-a.example is not provisioned" in said
    shown = preflight(root, "runs", "--json").stdout
    assert '"status": "awaiting_decision"' in shown and '"kind": "volume"' not in shown
