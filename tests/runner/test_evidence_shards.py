"""Evidence in shards (issue 35, point 1): many outputs packed into tar shards with an
index, checked shard by shard and member by member; links and odd names refused; a shard
cut off midway never counted; one output opened without unpacking anything."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from runner.evidence import EvidenceError, copy_evidence, show_output, verify_evidence
from runner.evidence_shards import INDEX, INDEX_COLUMNS

REPO = Path(__file__).resolve().parents[2]
SPEC = {"run_id": "r", "inputs": {"dir": "/in", "expected_count": 1},
        "project": {"params": {}}, "task": {"kind": "classify", "params": {}}}


def make_run(tmp: Path, count: int, nested: bool = False) -> Path:
    """A run directory with ``count`` outputs, each named by balance.csv."""
    run = tmp / "run"
    out = run / "outputs"
    out.mkdir(parents=True)
    (run / "manifest.yaml").write_text("name: t\n")
    (run / "spec.json").write_text(json.dumps(SPEC))
    (run / "environment.json").write_text("{}\n")
    (run / "events.jsonl").write_text('{"seq": 1}\n')
    (run / "balance.json").write_text(json.dumps({"ok": True, "run": "r"}))
    rows = ["id,status,category,reason,output\n"]
    for n in range(count):
        sub = f"d{n % 3}/" if nested else ""
        rel = f"outputs/{sub}doc-{n:05d}.json"
        path = run / rel
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps({"id": f"doc-{n:05d}", "n": n}))
        rows.append(f"doc-{n:05d},accepted,x,,{rel}\n")
    (run / "balance.csv").write_text("".join(rows))
    return run


def shards_of(dest: Path) -> list[str]:
    return sorted(p.name for p in (dest / "shards").iterdir())


def test_outputs_go_into_shards_with_an_index_and_verify(tmp_path: Path) -> None:
    run = make_run(tmp_path, 25, nested=True)
    dest = tmp_path / "dest"
    report = copy_evidence(str(run), str(dest), plain_max=10, shard_files=10)
    assert report.verified, report.problems
    assert report.shards == 3 and report.files == 25 + 6  # outputs + the run's own files
    assert not (dest / "outputs").exists()
    assert shards_of(dest) == ["outputs-000000.tar", "outputs-000001.tar",
                               "outputs-000002.tar"]
    sums = (dest / "SHA256SUMS").read_text().splitlines()
    assert {line[66:] for line in sums} >= {"shards/outputs-000000.tar", INDEX, "balance.csv"}
    index = (dest / INDEX).read_text().splitlines()
    assert index[0] == "\t".join(INDEX_COLUMNS) and len(index) == 26
    # any tar reads a shard; the member's name is the output's path in the run
    with tarfile.open(dest / "shards" / "outputs-000000.tar") as tar:
        names = tar.getnames()
        assert len(names) == 10 and all(n.startswith("outputs/d") for n in names)
        member = tar.extractfile(names[0])
        assert member is not None and json.loads(member.read())["id"]
    checked = verify_evidence(str(dest))
    assert checked.ok and checked.files == report.files and checked.bytes == report.bytes
    assert checked.shards == 3
    if shutil.which("sha256sum"):  # the list is still what sha256sum -c reads
        subprocess.run(["sha256sum", "--quiet", "-c", "SHA256SUMS"], cwd=dest, check=True,
                       timeout=60)


def test_a_small_run_keeps_plain_files(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    report = copy_evidence(str(make_run(tmp_path, 12)), str(dest))
    assert report.verified and report.shards == 0
    assert len(list((dest / "outputs").iterdir())) == 12
    assert not (dest / "shards").exists() and not (dest / INDEX).exists()


def test_a_tampered_shard_is_named_with_its_member(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 20)), str(dest), plain_max=5, shard_files=10)
    shard = dest / "shards" / "outputs-000001.tar"
    data = bytearray(shard.read_bytes())
    at = data.index(b'"n": 12') + 6
    data[at] = ord("9")  # doc-00012's bytes, same size
    shard.write_bytes(bytes(data))
    problems = verify_evidence(str(dest)).problems
    assert problems == [
        "shards/outputs-000001.tar: checksum mismatch (content changed)",
        "outputs/doc-00012.json: checksum mismatch in shards/outputs-000001.tar (content "
        "changed)"]


def test_a_tampered_index_is_named_and_its_shards_still_checked(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 20)), str(dest), plain_max=5, shard_files=10)
    index = dest / INDEX
    lines = index.read_text().splitlines(keepends=True)
    lines[3] = lines[3].replace("\t", "\tX", 1)  # points one output elsewhere
    index.write_text("".join(lines))
    problems = verify_evidence(str(dest)).problems
    assert problems[0] == f"{INDEX}: checksum mismatch (content changed)"
    assert any(p.startswith(f"{INDEX}: not trusted") for p in problems)
    # an index rewritten with its line in SHA256SUMS too: every member is compared
    sums = dest / "SHA256SUMS"
    lines = index.read_text().splitlines(keepends=True)
    parts = lines[3].replace("\tX", "\t", 1).split("\t")
    parts[3] = "0" * 64  # its sha256
    lines[3] = "\t".join(parts)
    index.write_text("".join(lines))
    digest = hashlib.sha256(index.read_bytes()).hexdigest()
    sums.write_text("".join(line if not line.endswith(f"  {INDEX}\n") else
                            f"{digest}  {INDEX}\n" for line in
                            sums.read_text().splitlines(keepends=True)))
    problems = verify_evidence(str(dest)).problems
    assert problems == ["outputs/doc-00002.json: checksum mismatch in "
                        "shards/outputs-000000.tar (content changed)"], problems


def test_a_shard_removed_or_added_is_named(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 20)), str(dest), plain_max=5, shard_files=10)
    os.remove(dest / "shards" / "outputs-000001.tar")
    (dest / "shards" / "outputs-000007.tar").write_bytes(b"\0" * 1024)
    problems = verify_evidence(str(dest)).problems
    assert "shards/outputs-000001.tar: missing" in problems
    assert "shards/outputs-000007.tar: present but not listed in SHA256SUMS" in problems


@pytest.mark.parametrize("plain_max", [1000, 2])
def test_links_fifos_and_odd_names_in_outputs_are_refused_never_followed(
        tmp_path: Path, plain_max: int) -> None:
    run = make_run(tmp_path, 4)
    secret = tmp_path / "secret.txt"
    secret.write_text("the bot host's secret")
    os.symlink(secret, run / "outputs" / "link.json")
    os.symlink(tmp_path, run / "outputs" / "linkdir")
    os.mkfifo(run / "outputs" / "pipe.json")
    (run / "outputs" / "bad\nname.json").write_text("{}")
    dest = tmp_path / "dest"
    report = copy_evidence(str(run), str(dest), plain_max=plain_max)
    assert not report.verified
    assert report.problems == [
        "outputs/link.json: a symbolic link: refused, not copied",
        "outputs/linkdir: a symbolic link: refused, not copied",
        "outputs/pipe.json: a FIFO: refused, not copied",
        "'outputs/bad\\nname.json': a name with a control character (a tab, a newline...): "
        "refused, not copied"] or sorted(report.problems) == sorted([
            "outputs/link.json: a symbolic link: refused, not copied",
            "outputs/linkdir: a symbolic link: refused, not copied",
            "outputs/pipe.json: a FIFO: refused, not copied",
            "'outputs/bad\\nname.json': a name with a control character (a tab, a "
            "newline...): refused, not copied"])
    copied = b"".join(p.read_bytes() for p in dest.rglob("*") if p.is_file())
    assert b"secret" not in copied
    assert verify_evidence(str(dest)).ok  # what was copied is whole; the refusals stand


KILLER = """
import os, signal, sys
from runner.evidence import copy_evidence

seen = []
def beat(where):
    if where.startswith("shards/outputs-000001.tar ("):
        seen.append(where)
        if len(seen) == 5:
            os.kill(os.getpid(), signal.SIGKILL)

copy_evidence(sys.argv[1], sys.argv[2], beat, plain_max=5, workers=1, shard_files=10)
"""


def test_a_shard_cut_off_midway_is_never_counted(tmp_path: Path) -> None:
    run = make_run(tmp_path, 30)
    dest = tmp_path / "dest"
    assert copy_evidence(str(run), str(dest), plain_max=5, shard_files=10).verified
    # a second copy killed inside its second shard: no SHA256SUMS (the old one removed
    # first), the cut shard only under its temporary name
    done = subprocess.run([sys.executable, "-c", KILLER, str(run), str(dest)], cwd=REPO,
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    assert not (dest / "SHA256SUMS").exists()
    leftovers = [p.name for p in (dest / "shards").iterdir() if p.name.startswith(".")]
    assert leftovers and all(".tmp-" in n for n in leftovers)
    report = verify_evidence(str(dest))
    assert not report.ok and report.files == 0
    assert report.problems[0].startswith("SHA256SUMS: missing")
    again = copy_evidence(str(run), str(dest), plain_max=5, shard_files=10)
    assert again.verified and again.files == 36
    assert not [p for p in (dest / "shards").iterdir() if p.name.startswith(".")]


def test_twenty_thousand_outputs(tmp_path: Path) -> None:
    """Two shards of 10,000 at the default sizes (a few seconds; the timing is bench/
    evidence.py's)."""
    run = make_run(tmp_path, 20_000)
    dest = tmp_path / "dest"
    report = copy_evidence(str(run), str(dest))
    assert report.verified, report.problems[:5]
    assert report.shards == 2 and report.files == 20_006
    assert shards_of(dest) == ["outputs-000000.tar", "outputs-000001.tar"]


def test_a_url_destination_gets_shards(tmp_path: Path) -> None:
    import fsspec

    url = "memory://evidence-shards/run-1"
    report = copy_evidence(str(make_run(tmp_path, 20)), url, plain_max=5, shard_files=10)
    assert report.verified, report.problems
    fs = fsspec.filesystem("memory")
    found = sorted(fs.find("/evidence-shards/run-1/shards"))
    assert [p.rsplit("/", 1)[1] for p in found] == ["outputs-000000.tar",
                                                     "outputs-000001.tar"]
    assert not fs.exists("/evidence-shards/run-1/outputs")
    data = bytearray(fs.cat_file(found[0]))
    data[-2000] ^= 1  # in the archive's padding: the shard's own hash still catches it
    fs.pipe_file(found[0], bytes(data))
    assert verify_evidence(url).problems == [
        "shards/outputs-000000.tar: checksum mismatch (content changed)"]
    out = io.BytesIO()
    assert show_output(url, "doc-00015", out).endswith("(member of shards/outputs-000001.tar)")
    assert json.loads(out.getvalue())["n"] == 15


def test_one_output_is_opened_by_id_or_path(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 20)), str(dest), plain_max=5, shard_files=10)
    out = io.BytesIO()
    where = show_output(str(dest), "doc-00013", out)
    assert where == "outputs/doc-00013.json (member of shards/outputs-000001.tar)"
    assert json.loads(out.getvalue()) == {"id": "doc-00013", "n": 13}
    out = io.BytesIO()
    show_output(str(dest), "outputs/doc-00002.json", out)
    assert json.loads(out.getvalue())["n"] == 2
    with pytest.raises(EvidenceError, match="no input 'nope' in balance.csv"):
        show_output(str(dest), "nope", io.BytesIO())
    shard = dest / "shards" / "outputs-000001.tar"
    data = bytearray(shard.read_bytes())
    data[data.index(b'"n": 13') + 6] = ord("7")
    shard.write_bytes(bytes(data))
    out = io.BytesIO()
    with pytest.raises(EvidenceError, match="shards/outputs-000001.tar: the member's bytes "
                                            "do not match"):
        show_output(str(dest), "doc-00013", out)
    assert out.getvalue() == b""  # nothing unchecked is written


def test_a_plain_output_is_opened_too(tmp_path: Path) -> None:
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 3)), str(dest))
    out = io.BytesIO()
    assert show_output(str(dest), "doc-00001", out) == "outputs/doc-00001.json"
    assert json.loads(out.getvalue())["n"] == 1


def test_preflight_evidence_show(tmp_path: Path) -> None:
    import typer
    from typer.testing import CliRunner

    from bot.cli.evidence import register

    app = typer.Typer()
    register(app)
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 20)), str(dest), plain_max=5, shard_files=10)
    cli = CliRunner()
    shown = cli.invoke(app, ["evidence", "show", str(dest), "doc-00004"])
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.stdout) == {"id": "doc-00004", "n": 4}
    assert "outputs/doc-00004.json (member of shards/outputs-000000.tar)" in shown.stderr
    missing = cli.invoke(app, ["evidence", "show", str(dest), "doc-99"])
    assert missing.exit_code == 1 and "no input 'doc-99' in balance.csv" in missing.stderr
    said = cli.invoke(app, ["verify", str(dest)])
    assert said.exit_code == 0 and "26 files (2 shards)" in said.stdout


def test_the_fast_tar_header_is_the_one_tarfile_writes() -> None:
    from runner.evidence_shards import _header

    for name, size, mtime in [("outputs/doc-0000001.json", 77, 1733380000.7),
                              ("outputs/a", 0, 0), ("outputs/" + "x" * 91, (2 << 30) - 5, 0)]:
        info = tarfile.TarInfo(name)
        info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o644, tarfile.REGTYPE
        assert _header(name, size, mtime) == info.tobuf(tarfile.USTAR_FORMAT, "utf-8",
                                                        "strict"), name
    long = "outputs/" + "é" * 120  # beyond USTAR: tarfile's PAX headers, read back whole
    assert tarfile.TarInfo.frombuf(_header(long, 1, 0)[:512], "utf-8",
                                   "strict").type == tarfile.XHDTYPE


def test_long_and_unicode_names_go_through_pax_headers(tmp_path: Path) -> None:
    run = make_run(tmp_path, 8)
    deep = run / "outputs" / ("ü" * 60) / ("日本" * 40 + ".json")
    deep.parent.mkdir()
    deep.write_text('{"deep": true}')
    dest = tmp_path / "dest"
    report = copy_evidence(str(run), str(dest), plain_max=2)
    assert report.verified, report.problems
    assert verify_evidence(str(dest)).ok
    rel = deep.relative_to(run).as_posix()
    out = io.BytesIO()
    show_output(str(dest), rel, out)
    assert out.getvalue() == b'{"deep": true}'


def test_a_forged_shard_with_a_link_member_is_named(tmp_path: Path) -> None:
    """A node's shard and index that agree with SHA256SUMS but hold a link (written by
    someone else than the runner): the member is named, never taken."""
    dest = tmp_path / "dest"
    copy_evidence(str(make_run(tmp_path, 20)), str(dest), plain_max=5, shard_files=10)
    shard = dest / "shards" / "outputs-000000.tar"
    with tarfile.open(shard, "w", format=tarfile.PAX_FORMAT) as tar:
        link = tarfile.TarInfo("outputs/doc-00000.json")
        link.type, link.linkname = tarfile.SYMTYPE, "/etc/passwd"
        tar.addfile(link)
    sums = dest / "SHA256SUMS"
    digest = hashlib.sha256(shard.read_bytes()).hexdigest()
    sums.write_text("".join(
        f"{digest}  shards/outputs-000000.tar\n" if line.endswith("outputs-000000.tar\n")
        else line for line in sums.read_text().splitlines(keepends=True)))
    problems = verify_evidence(str(dest)).problems
    assert problems[0] == ("shards/outputs-000000.tar: member 'outputs/doc-00000.json' is "
                           "not a regular file")
    assert "outputs/doc-00001.json: in outputs.index.tsv but not in " \
           "shards/outputs-000000.tar" in problems


def test_a_plain_copy_made_again_in_shards_leaves_no_plain_outputs(tmp_path: Path) -> None:
    run = make_run(tmp_path, 12, nested=True)
    dest = tmp_path / "dest"
    assert copy_evidence(str(run), str(dest)).verified
    assert (dest / "outputs" / "d0").is_dir()
    again = copy_evidence(str(run), str(dest), plain_max=5)
    assert again.verified and again.shards == 1
    assert not (dest / "outputs").exists()  # its files and emptied folders removed


def test_the_evidence_stage_packs_a_large_run_and_says_so(tmp_path: Path) -> None:
    from runner.spec import RunSpec
    from runner.stage import StageContext
    from runner.stages.evidence import evidence

    run = make_run(tmp_path, 1_200)
    inputs = tmp_path / "in"
    inputs.mkdir()
    spec = RunSpec.from_dict({"run_id": "r", "name": "p", "inputs": {"dir": str(inputs)},
                              "results": {"copy_to": str(tmp_path / "ev")}})
    beats: list[str] = []
    events: list[tuple[str, dict[str, object]]] = []
    ctx = StageContext(spec=spec, run_dir=str(run), beat=beats.append,
                       emit=lambda etype, **data: events.append((etype, data)))
    facts = evidence(ctx, progress_every_s=0)
    assert facts["verified"] and facts["shards"] == 1 and facts["files"] == 1_207
    assert {e[0] for e in events} == {"evidence.progress", "evidence"}
    assert events[-1][0] == "evidence" and events[-1][1]["shards"] == 1
    assert any(e[1]["at"].startswith("shards/outputs-000000.tar (outputs/doc-") for e in events)
    assert len(beats) > 1_200  # every member moved is a sign of progress
    assert (tmp_path / "ev" / "r" / "shards" / "outputs-000000.tar").is_file()


def test_an_outputs_folder_that_is_a_link_is_refused(tmp_path: Path) -> None:
    run = make_run(tmp_path, 0)
    os.rmdir(run / "outputs")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "secret.json").write_text("{}")
    os.symlink(elsewhere, run / "outputs")
    report = copy_evidence(str(run), str(tmp_path / "dest"))
    assert report.problems == ["outputs: a symbolic link: refused, not copied"]
    assert not (tmp_path / "dest" / "outputs").exists()


def test_one_line_of_a_volume_jsonl_output_is_shown_by_id(tmp_path: Path) -> None:
    """A volume's outputs are JSONL files (outputs/shards/<name>.jsonl, one line per
    input, balance.csv naming `<file>#<line>`): the id's own line is printed, from a
    plain copy and from a shard."""
    run = make_run(tmp_path, 0)
    lines = [json.dumps({"id": f"v-{n}", "output": {"n": n}}) + "\n" for n in range(40)]
    (run / "outputs" / "shards").mkdir()
    (run / "outputs" / "shards" / "a1-w0-000001.jsonl").write_text("".join(lines))
    (run / "balance.csv").write_text("id,status,category,reason,output\n" + "".join(
        f"v-{n},accepted,x,,outputs/shards/a1-w0-000001.jsonl#{n + 1}\n" for n in range(40)))
    for plain_max, dest in ((1000, tmp_path / "plain"), (0, tmp_path / "sharded")):
        assert copy_evidence(str(run), str(dest), plain_max=plain_max).verified
        out = io.BytesIO()
        where = show_output(str(dest), "v-17", out)
        assert json.loads(out.getvalue()) == {"n": 17}
        assert where.startswith("outputs/shards/a1-w0-000001.jsonl line 18")
    (run / "balance.csv").write_text("id,status,category,reason,output\n"
                                     "v-3,accepted,x,,outputs/shards/a1-w0-000001.jsonl#5\n")
    dest = tmp_path / "wrong"
    copy_evidence(str(run), str(dest))
    with pytest.raises(EvidenceError, match="line 5 holds the output of 'v-4', not of 'v-3'"):
        show_output(str(dest), "v-3", io.BytesIO())


def test_a_long_events_file_is_copied_to_its_last_complete_line(tmp_path: Path) -> None:
    run = make_run(tmp_path, 3)
    lines = "".join(json.dumps({"seq": n, "pad": "x" * 200}) + "\n" for n in range(2_000))
    torn = '{"seq": 2000, "pad": "' + "y" * 150_000  # longer than one backward read
    (run / "events.jsonl").write_text(lines + torn)
    dest = tmp_path / "dest"
    assert copy_evidence(str(run), str(dest)).verified
    assert (dest / "events.jsonl").read_text() == lines
