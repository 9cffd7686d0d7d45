"""`make demo`'s story up to the approval: the corpus made deterministically, the pilot,
its forecast, and the one command that approves the volume (issue 27)."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
from pathlib import Path

from tests.e2e.test_pilot_cli import REPO, preflight, project


def _digest(directory: Path) -> str:
    sha = hashlib.sha256()
    for path in sorted(directory.iterdir()):
        sha.update(path.name.encode() + b"\0" + path.read_bytes())
    return sha.hexdigest()


def test_the_demo_corpus_is_the_same_every_time(tmp_path: Path) -> None:
    script = str(REPO / "data" / "make_corpus.py")
    for where in ("a", "b"):
        subprocess.run([sys.executable, script, str(tmp_path / where), "3000"], check=True,
                       capture_output=True, timeout=120)
    assert _digest(tmp_path / "a") == _digest(tmp_path / "b")
    names = sorted(p.name for p in (tmp_path / "a").iterdir())
    assert len(names) == 3000 and names[0] == "doc-00001.txt" and names[-1] == "doc-03000.txt"
    again = subprocess.run([sys.executable, script, str(tmp_path / "a"), "3000"], check=True,
                           capture_output=True, text=True, timeout=120)
    assert "0 written, 3000 already there" in again.stdout


def test_the_demo_ends_with_the_forecast_and_the_command_that_approves_it(
        tmp_path: Path) -> None:
    root = project(tmp_path)
    shutil.copy(REPO / "manifests" / "demo.yaml", root / "manifests" / "demo.yaml")
    subprocess.run([sys.executable, str(REPO / "data" / "make_corpus.py"),
                    str(root / "data" / "corpus"), "3000"], check=True, capture_output=True,
                   timeout=120)
    done = preflight(root, "run", "manifests/demo.yaml", "--by", "alice")
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "Volume (on approval)" in out and "3000 inputs" in out
    assert out.index("Verdict: PASSED") < out.index("Forecast") < out.rindex("Decision")
    last = " ".join(out[out.rindex("╯") + 1:].split())  # after the decision panel
    assert last.startswith("Approve the volume (3000 inputs): preflight decide ")
    assert last.endswith(' approve --reason "…" --by NAME. Who may approve (--by): '
                         'U0APPROVER, alice (approvals.approvers)')  # whose name NAME is
