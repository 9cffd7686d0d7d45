"""The 12-document pilot end to end through the `preflight` command, in a temp directory."""

from __future__ import annotations

import csv
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXPECTED = {
    "doc-01": "invoice", "doc-02": "contract", "doc-03": "support", "doc-04": "research",
    "doc-05": "invoice", "doc-06": "contract", "doc-08": "support", "doc-09": "research",
    "doc-10": "invoice", "doc-11": "contract", "doc-12": "research",
}
IDS = sorted([*EXPECTED, "doc-07"])


def project(tmp_path: Path) -> Path:
    """A copy of the demo's manifest and documents, so the run writes nothing in the repo."""
    root = tmp_path / "project"
    (root / "manifests").mkdir(parents=True)
    shutil.copytree(REPO / "data" / "pilote", root / "data" / "pilote")
    shutil.copy(REPO / "manifests" / "pilote.yaml", root / "manifests" / "pilote.yaml")
    shutil.copy(REPO / "requirements-rebuild.txt", root / "requirements-rebuild.txt")
    return root


def preflight(home: Path, *args: str, env: dict[str, str] | None = None,
              timeout: float = 240) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items()
                if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    full_env.update({"PREFLIGHT_HOME": str(home), "COLUMNS": "120", **(env or {})})
    return subprocess.run([sys.executable, "-m", "bot", *args], cwd=home, env=full_env,
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    root = project(tmp_path_factory.mktemp("demo"))
    done = preflight(root, "run", "manifests/pilote.yaml", "--decide", "approve",
                     "--reason", "11 accepted, doc-07 refused as expected", "--by", "alice")
    return root, done


def run_dirs(root: Path) -> list[Path]:
    return sorted(p for p in (root / "runs").iterdir() if p.is_dir())


Demo = tuple[Path, subprocess.CompletedProcess[str]]


def test_demo_pilot_passes_with_the_expected_balance(demo: Demo) -> None:
    root, done = demo
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    for text in ("Plan for pilote-demo", "0.00 USD × 3 days × 1 lot", "Balance",
                 "Verdict: PASSED", "Decision: Scale-up approved"):
        assert text in out, text
    (run_dir,) = run_dirs(root)
    balance = json.loads((run_dir / "balance.json").read_text())
    counts = (balance["accepted"], balance["refused"], balance["total"], balance["ok"])
    assert counts == (11, 1, 12, True)
    with open(run_dir / "balance.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert sorted(r["id"] for r in rows) == IDS
    by_id = {r["id"]: r for r in rows}
    assert {i: by_id[i]["category"] for i in EXPECTED} == EXPECTED
    assert by_id["doc-07"]["status"] == "refused" and by_id["doc-07"]["reason"]
    db = sqlite3.connect(root / "state" / "preflight.db")
    items = db.execute("SELECT item_id, status, category FROM items ORDER BY item_id").fetchall()
    assert [i[0] for i in items] == IDS
    assert {i: c for i, s, c in items if s == "accepted"} == EXPECTED
    status, outcome = db.execute("SELECT status, outcome FROM runs").fetchone()
    assert (status, outcome) == ("decided", "passed")
    decision = db.execute("SELECT decision, by, accepted FROM decisions").fetchall()
    assert decision == [("approve", "alice", 1)]
    # what exactly ran travels with the evidence: commit, handler file hash, input checksums
    prov = json.loads((run_dir / "provenance.json").read_text())
    assert prov["project"]["git_commit"] == "not a git checkout"
    [code] = prov["code"]
    assert code["ref"] == "runner.workloads.classify:handle" and len(code["sha256"]) == 64
    assert [i["id"] for i in prov["inputs"]] == IDS
    assert all(len(i["sha256"]) == 64 for i in prov["inputs"])
    sums = next((root / "evidence").rglob("SHA256SUMS")).read_text()
    assert "  provenance.json\n" in sums


def test_runs_and_show(demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, _ = demo
    listed = json.loads(preflight(root, "runs", "--json").stdout)
    assert [(r["status"], r["outcome"]) for r in listed] == [("decided", "passed")]
    shown = preflight(root, "show", listed[0]["id"], "--json")
    data = json.loads(shown.stdout)
    assert {s["stage"]: s["state"] for s in data["stages"]}["pilot"] == "passed"
    assert data["balance"]["accepted"] == 11
    assert data["decisions"][0]["reason"] == "11 accepted, doc-07 refused as expected"
    missing = preflight(root, "show", "no-such-run")
    assert missing.returncode == 2 and "no run 'no-such-run'" in missing.stderr


def test_evidence_show_prints_one_output_of_the_run(
        demo: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    root, _ = demo
    (run_dir,) = run_dirs(root)
    with open(run_dir / "balance.csv", newline="") as fh:
        row = next(r for r in csv.DictReader(fh) if r["status"] == "accepted" and r["output"])
    shown = preflight(root, "evidence", "show", "latest", row["id"])
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout == (run_dir / row["output"]).read_text()
    assert f"{row['output']} from " in shown.stderr
    assert preflight(root, "evidence", "show", "no-such-run", "x").returncode == 2


def test_second_run_gets_its_own_directory(tmp_path: Path) -> None:
    root = project(tmp_path)
    first = preflight(root, "run", "manifests/pilote.yaml")
    second = preflight(root, "run", "manifests/pilote.yaml")
    assert (first.returncode, second.returncode) == (0, 0), second.stderr
    dirs = run_dirs(root)
    assert len(dirs) == 2
    for d in dirs:
        assert len([ln for ln in (d / "events.jsonl").read_text().splitlines()
                    if '"run.started"' in ln]) == 1
    assert "Changed since the previous attempt" not in second.stdout


def test_runner_without_torch_reports_the_torch_stage(tmp_path: Path) -> None:
    root = project(tmp_path)
    # Without a requirements file the environment stage has nothing to say about torch,
    # so the torch stage itself is the first error (with one, environment fails first).
    path = root / "manifests" / "pilote.yaml"
    path.write_text(path.read_text().replace("  requirements: requirements-rebuild.txt\n", ""))
    bare = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(bare)], check=True)
    done = preflight(root, "run", "manifests/pilote.yaml",
                     env={"PREFLIGHT_RUNNER_PYTHON": str(bare / "bin" / "python")})
    assert done.returncode == 1, done.stdout + done.stderr
    assert "First error" in done.stdout
    (run_dir,) = run_dirs(root)
    events = [json.loads(ln) for ln in (run_dir / "events.jsonl").read_text().splitlines()]
    failed = [e for e in events if e["type"] == "stage.failed"]
    assert failed[0]["stage"] == "torch"
    assert "No module named 'torch'" in failed[0]["error"]["message"]
    skipped = {e["stage"] for e in events if e["type"] == "stage.skipped"}
    assert {"device", "compute", "pilot", "balance"} <= skipped
    db = sqlite3.connect(root / "state" / "preflight.db")
    (first_error,) = db.execute("SELECT first_error FROM runs").fetchone()
    assert json.loads(first_error)["stage"] == "torch"


def test_bad_manifest_exits_2_naming_the_field(tmp_path: Path) -> None:
    root = project(tmp_path)
    path = root / "manifests" / "pilote.yaml"
    path.write_text(path.read_text().replace("lots: 1", "lots: 11"))
    done = preflight(root, "run", "manifests/pilote.yaml")
    assert done.returncode == 2
    assert "hardware.lots" in done.stderr and "line" in done.stderr
    assert not (root / "runs").exists() or not list((root / "runs").iterdir())


def test_decide_later_and_bad_invocation(demo: tuple[Path, subprocess.CompletedProcess[str]],
                                         tmp_path: Path) -> None:
    root = project(tmp_path)
    done = preflight(root, "run", "manifests/pilote.yaml")
    assert "preflight decide" in done.stdout
    run_id = json.loads(preflight(root, "runs", "--json").stdout)[0]["id"]
    refused = preflight(root, "decide", run_id, "approve", "--reason", "ok", "--by", "mallory")
    assert refused.returncode == 1 and "not an approver" in refused.stderr
    ok = preflight(root, "decide", run_id, "fix-env", "--reason", "try a newer driver",
                   "--by", "bob")
    assert ok.returncode == 0, ok.stderr
    bad = preflight(root, "run", "manifests/pilote.yaml", "--decide", "maybe", "--reason", "x")
    assert bad.returncode == 2 and "--decide" in bad.stderr


def test_decision_prompt_on_a_terminal(tmp_path: Path) -> None:
    """On a terminal the run ends with the decision prompt; the answer is stored."""
    import pty
    import select

    root = project(tmp_path)
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env.update({"PREFLIGHT_HOME": str(root), "COLUMNS": "120", "TERM": "dumb"})
    proc = subprocess.Popen([sys.executable, "-m", "bot", "run", "manifests/pilote.yaml"],
                            cwd=root, env=env, stdin=slave, stdout=slave, stderr=slave)
    os.close(slave)
    # Each answer goes to its own prompt, in order, looked for only in what came after the
    # previous answer (a busy machine cuts the output anywhere: a display line ending in ':'
    # must not be taken for a prompt).
    prompts = [(b"empty to decide later):", "revise"),
               (b"Reason:", "raise batch_size to 8 next time"), (b"Decided by", "bob")]
    seen = b""
    answered_at = 0
    try:
        while proc.poll() is None or select.select([master], [], [], 0)[0]:
            ready, _, _ = select.select([master], [], [], 120)
            assert ready, "the run printed nothing for 120 s"
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the process ended
                break
            seen += chunk
            tail = seen[answered_at:]
            if prompts and prompts[0][0] in tail and tail.rstrip().endswith(b":"):
                os.write(master, prompts.pop(0)[1].encode() + b"\n")
                seen += b"\n"
                answered_at = len(seen)
    finally:
        os.close(master)
        if proc.poll() is None and prompts:
            proc.kill()
    assert proc.wait(timeout=60) == 0
    text = seen.decode(errors="replace")
    assert "Decision (approve / fix-env / revise" in text
    db = sqlite3.connect(root / "state" / "preflight.db")
    assert db.execute("SELECT decision, reason, by, accepted FROM decisions").fetchall() == [
        ("revise", "raise batch_size to 8 next time", "bob", 1)]
