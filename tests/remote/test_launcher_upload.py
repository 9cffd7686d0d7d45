"""The node's launcher as the bot drives it over one SSH session: the workdir's lock, then
the hashes, the files and the launch on its standard input (``LAUNCH_SCRIPT``), run here
with the bare interpreter a node has. The SSH side of it is in test_remote_dispatch.py.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

from bot.node_programs import LAUNCH_SCRIPT
from tests.remote.remote_kit import wait_for
from tests.remote.sshd_server import BARE_PYTHON


def launcher(workdir: Path, *argv: str) -> subprocess.Popen[bytes]:
    run_dir = workdir / "runs" / "r1"
    proc = subprocess.Popen([BARE_PYTHON, "-c", LAUNCH_SCRIPT, str(workdir / "dispatch.lock"),
                             "r1", str(run_dir), str(workdir), str(workdir), *argv],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    assert json.loads(proc.stdout.readline()) == {"locked": "r1"}
    return proc


def put(path: Path, data: bytes) -> bytes:
    return b"put " + json.dumps([str(path), len(data)]).encode() + b"\n" + data


def test_the_launcher_hashes_writes_and_launches_in_one_session(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    (workdir / "proj").mkdir(parents=True)
    (workdir / "proj" / "old.txt").write_text("old")
    (workdir / "proj" / ".venv").mkdir()
    (workdir / "proj" / ".venv" / "big").write_text("never hashed")
    (workdir / "proj" / "corpus").mkdir()
    (workdir / "proj" / "corpus" / "doc.txt").write_text("excluded: never hashed")
    with launcher(workdir, "sh", "-c", "cat proj/new.bin > out.txt") as proc:
        talk(proc, workdir)
    wait_for(lambda: (workdir / "runs" / "r1" / "exit_code").exists(), what="the runner")
    assert (workdir / "out.txt").read_bytes() == BLOB
    wait_for(lambda: not (workdir / "dispatch.lock").exists(), what="the lock to go")


BLOB = bytes(range(256)) * 4 + b"\nlaunch\n"  # binary, with lines of the protocol in it


def talk(proc: subprocess.Popen[bytes], workdir: Path) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    roots = [str(workdir / "proj"), str(workdir / "pkg")]
    dirs = [str(workdir / "proj" / "a" / "b"), str(workdir / "runs" / "r1")]
    excluded = [str(workdir / "proj" / "corpus")]  # a pilot's volume corpus: left alone
    proc.stdin.write(b"hash " + json.dumps([[".venv"], [], roots, dirs, excluded]).encode()
                     + b"\n")
    proc.stdin.flush()
    lines = [json.loads(proc.stdout.readline()) for _ in range(3)]
    assert lines == [{"root": roots[0], "files": {"old.txt": hashlib.sha256(b"old").hexdigest()}},
                     {"root": roots[1], "files": {}}, {"end": 1}]
    assert json.loads((workdir / "hash-cache.json").read_text()) == {}  # old.txt: just made
    assert all(Path(d).is_dir() for d in dirs)
    proc.stdin.write(put(workdir / "proj" / "new.bin", BLOB)
                     + put(workdir / "proj" / "a" / "b" / "empty", b"")
                     + put(workdir / "proj" / "no-such-dir" / "x", b"lost") + b"sync\n")
    proc.stdin.flush()
    answer = json.loads(proc.stdout.readline())
    assert len(answer["failed"]) == 1 and "no-such-dir/x" in answer["failed"][0]
    assert (workdir / "proj" / "new.bin").read_bytes() == BLOB
    assert (workdir / "proj" / "a" / "b" / "empty").read_bytes() == b""
    assert not list(workdir.rglob("*.part"))
    proc.stdin.write(b"launch\n")
    proc.stdin.close()
    pid = int(proc.stdout.read().strip().splitlines()[-1])
    assert proc.wait(30) == 0 and pid > 1


def test_a_bot_gone_in_the_middle_of_a_file_leaves_no_file_and_no_lock(tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    (workdir / "proj").mkdir(parents=True)
    with launcher(workdir, "true") as proc:
        assert proc.stdin is not None
        header = b"put " + json.dumps([str(workdir / "proj" / "f"), 1000]).encode() + b"\n"
        proc.stdin.write(header + b"x" * 10)  # 10 bytes of 1,000, then the connection is gone
        proc.stdin.close()
        assert proc.wait(30) == 0
    assert not (workdir / "dispatch.lock").exists()
    assert not (workdir / "proj" / "f").exists() and not list(workdir.rglob("*.part"))
    assert not (workdir / "runs" / "r1" / "runner.pid").exists()  # nothing launched
