from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import typer
from typer.testing import CliRunner

from bot.cli.evidence import register
from runner.evidence import copy_evidence, verify_evidence

REPO = Path(__file__).resolve().parents[2]

REPO = Path(__file__).resolve().parents[2]
SPEC = {"run_id": "r", "inputs": {"dir": "/in", "expected_count": 1},
        "project": {"params": {"lang": "pt"}}, "task": {"kind": "classify", "params": {}}}


def make_run(tmp: Path) -> Path:
    run = tmp / "run"
    (run / "outputs").mkdir(parents=True)
    (run / "manifest.yaml").write_text("name: t\n")
    (run / "spec.json").write_text(json.dumps(SPEC))
    (run / "environment.json").write_text("{}\n")
    (run / "events.jsonl").write_text('{"seq": 1}\n{"seq": 2, "torn')  # torn last line
    (run / "balance.json").write_text(json.dumps(
        {"ok": True, "run": "r", "rows": [{"id": "a", "output": "outputs/a.json"}]}))
    (run / "balance.csv").write_text("id,status,category,reason,output\n"
                                     "a,accepted,x,,outputs/a.json\n")
    (run / "outputs" / "a.json").write_text('{"category": "x"}')
    (run / "outputs" / ".b.json.tmp-1").write_text("partial")
    (run / "ledger.sqlite").write_bytes(b"not copied")
    return run


def test_copy_then_verify(tmp_path: Path) -> None:
    report = copy_evidence(str(make_run(tmp_path)), str(tmp_path / "dest"))
    assert report.verified and report.problems == []
    dest = tmp_path / "dest"
    assert sorted(p.name for p in dest.iterdir()) == sorted(
        ["SHA256SUMS", "balance.csv", "balance.json", "environment.json", "events.jsonl",
         "manifest.yaml", "outputs", "spec.json"])
    assert (dest / "events.jsonl").read_text() == '{"seq": 1}\n'
    assert [p.name for p in (dest / "outputs").iterdir()] == ["a.json"]
    assert verify_evidence(str(dest)).ok


def test_one_byte_changed_is_named(tmp_path: Path) -> None:
    copy_evidence(str(make_run(tmp_path)), str(tmp_path / "d"))
    path = tmp_path / "d" / "outputs" / "a.json"
    data = bytearray(path.read_bytes())
    data[3] ^= 1
    path.write_bytes(bytes(data))
    rep = verify_evidence(str(tmp_path / "d"))
    assert not rep.ok and rep.problems == ["outputs/a.json: checksum mismatch (content changed)"]


def test_a_missing_file_and_a_missing_manifest_are_named(tmp_path: Path) -> None:
    copy_evidence(str(make_run(tmp_path)), str(tmp_path / "d"))
    os.remove(tmp_path / "d" / "balance.csv")
    assert verify_evidence(str(tmp_path / "d")).problems == ["balance.csv: missing"]
    os.remove(tmp_path / "d" / "SHA256SUMS")
    rep = verify_evidence(str(tmp_path / "d"))
    assert not rep.ok and rep.problems[0].startswith("SHA256SUMS: missing")


def test_a_run_without_its_manifest_does_not_verify(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    os.remove(run / "manifest.yaml")
    report = copy_evidence(str(run), str(tmp_path / "d"))
    assert not report.verified
    assert "manifest.yaml: missing in the run directory" in report.problems
    assert any(p.startswith("manifest.yaml: missing from SHA256SUMS")
               for p in verify_evidence(str(tmp_path / "d")).problems)


def test_an_added_file_and_an_output_the_balance_names_are_checked(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    os.remove(run / "outputs" / "a.json")
    rep = copy_evidence(str(run), str(tmp_path / "d"))
    assert "outputs/a.json: named by balance.csv (item a) but not in the copy" in rep.problems
    (tmp_path / "d" / "extra.txt").write_text("?")
    assert "extra.txt: present but not listed in SHA256SUMS" in \
        verify_evidence(str(tmp_path / "d")).problems


def test_an_fsspec_url_destination(tmp_path: Path) -> None:
    report = copy_evidence(str(make_run(tmp_path)), "memory://evidence-l/run-1")
    assert report.verified, report.problems
    import fsspec

    fs = fsspec.filesystem("memory")
    fs.pipe_file("/evidence-l/run-1/balance.csv", b"tampered")
    assert verify_evidence("memory://evidence-l/run-1").problems == [
        "balance.csv: checksum mismatch (content changed)"]


def test_a_url_without_fsspec_is_a_clear_error(tmp_path: Path) -> None:
    shadow = tmp_path / "shadow" / "fsspec"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('no fsspec here')\n")
    code = ("from runner.evidence import copy_evidence, EvidenceError\n"
            "try:\n    copy_evidence('.', 's3://bucket/x')\n"
            "except EvidenceError as e:\n    print('ERR', e)\n")
    env = {**os.environ, "PYTHONPATH": f"{tmp_path / 'shadow'}{os.pathsep}{REPO}"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=60, check=True).stdout
    assert "ERR results.copy_to s3://bucket/x: a URL destination needs the fsspec" in out


def test_preflight_verify_command(tmp_path: Path) -> None:
    app = typer.Typer()
    register(app)

    @app.command("noop")
    def _noop() -> None:  # a second command keeps `verify` a named subcommand
        """unused"""

    copy_evidence(str(make_run(tmp_path)), str(tmp_path / "d"))
    cli = CliRunner()
    ok = cli.invoke(app, ["verify", str(tmp_path / "d")])
    assert ok.exit_code == 0 and "verified" in ok.output
    (tmp_path / "d" / "spec.json").write_text("{}")
    bad = cli.invoke(app, ["verify", str(tmp_path / "d"), "--json"])
    assert bad.exit_code == 1
    assert json.loads(bad.output)["problems"] == ["spec.json: checksum mismatch (content changed)"]
    # an unusable path is a bad invocation (exit 2), not an evidence folder that failed
    missing = cli.invoke(app, ["verify", str(tmp_path / "nowhere")])
    assert missing.exit_code == 2 and "no such directory" in missing.output
    assert cli.invoke(app, ["verify", str(tmp_path / "d" / "spec.json")]).exit_code == 2


def copy_with(tmp: Path, name: str, text: str) -> list[str]:
    run = make_run(tmp)
    (run / name).write_text(text)
    return copy_evidence(str(run), str(tmp / "d")).problems


def test_a_spec_without_its_parameters_does_not_verify(tmp_path: Path) -> None:
    spec = {**SPEC, "project": {}}
    assert copy_with(tmp_path, "spec.json", json.dumps(spec)) == [
        "spec.json: no project.params (needed to understand the result)"]


def test_an_empty_manifest_or_unreadable_environment_does_not_verify(tmp_path: Path) -> None:
    assert copy_with(tmp_path / "a", "manifest.yaml", "\n") == [
        "manifest.yaml: empty (the manifest as submitted is needed)"]
    assert copy_with(tmp_path / "b", "environment.json", "[1,") == [
        "environment.json: not a JSON object"]


def test_a_balance_of_another_run_or_without_its_columns_does_not_verify(
        tmp_path: Path) -> None:
    assert copy_with(tmp_path / "a", "balance.json", '{"run": "other", "rows": null}') == [
        "balance.json: run 'other' is not the spec's run 'r'"]
    assert copy_with(tmp_path / "b", "balance.csv", "id,status\na,accepted\n") == [
        "balance.csv: no column category, reason (expected at least id,status,category,"
        "reason)"]


def test_the_copy_counts_the_files_that_verify_counts(tmp_path: Path) -> None:
    copied = copy_evidence(str(make_run(tmp_path)), str(tmp_path / "d"))
    checked = verify_evidence(str(tmp_path / "d"))
    assert copied.verified and checked.ok
    assert copied.files == checked.files  # the panel and `preflight verify` say the same
    assert copied.bytes == checked.bytes


VERIFY_SIDE = """
import json, re, sys
from pathlib import Path
from runner.evidence import verify_evidence

def status(key):
    return int(re.search(key + r":\\s+(\\d+)", Path("/proc/self/status").read_text()).group(1))

base = status("VmRSS")
Path("/proc/self/clear_refs").write_text("5")
report = verify_evidence(sys.argv[1])
print(json.dumps({"ok": report.ok, "bytes": report.bytes,
                  "growth_mib": (status("VmHWM") - base) // 1024}))
"""


def test_verification_hashes_a_large_file_in_chunks(tmp_path: Path) -> None:
    """A fetched evidence copy holds files of up to 2 GiB: verifying one never reads it whole
    into memory (issue 32). Measured in a process of its own (peak RSS from /proc)."""
    run = make_run(tmp_path)
    big = run / "outputs" / "big.bin"
    digest = hashlib.sha256()
    with open(big, "wb") as fh:
        for n in range(160):
            chunk = bytes([n]) * (1 << 20)
            fh.write(chunk)
            digest.update(chunk)
    dest = tmp_path / "dest"
    assert copy_evidence(str(run), str(dest)).verified
    done = subprocess.run([sys.executable, "-c", VERIFY_SIDE, str(dest)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    found = json.loads(done.stdout)
    assert found["ok"] and found["bytes"] > 160 << 20
    assert found["growth_mib"] < 40, found


def test_the_full_lists_events_name_are_copied_with_the_evidence(tmp_path: Path) -> None:
    run = make_run(tmp_path)
    (run / "event-lists").mkdir()
    (run / "event-lists" / "7-workers.json").write_text('{"list": [1, 2]}\n')
    (run / "event-lists" / ".8-problems.json.tmp").write_text("partial")
    report = copy_evidence(str(run), str(tmp_path / "dest"))
    assert report.verified, report.problems
    assert [p.name for p in (tmp_path / "dest" / "event-lists").iterdir()] == ["7-workers.json"]
