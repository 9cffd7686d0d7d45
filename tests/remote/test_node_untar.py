"""The upload's archive on the node: the launcher's ``tar`` command (``untar.py`` in
``LAUNCH_SCRIPT``), run here with the bare interpreter a node has, fed the framed stream
the bot writes (``bot/nodes/ssh/archive.py``), and fed archives made to escape the workdir.
"""

from __future__ import annotations

import io
import json
import os
import stat
import tarfile
from collections.abc import Callable
from pathlib import Path

import pytest

from bot.errors import DispatchError
from bot.node_programs.untar import Chunks, untar
from bot.nodes.ssh.archive import CHUNK, END, frame, header, write_archive
from tests.remote.test_launcher_upload import launcher


def framed(raw: bytes) -> bytes:
    return b"".join(frame(raw[i:i + 700]) for i in range(0, len(raw), 700)) + END


def archive(add: Callable[[tarfile.TarFile], None]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        add(tar)
    return buf.getvalue()


def member(name: str, data: bytes = b"x", kind: bytes = tarfile.REGTYPE,
           link: str = "") -> Callable[[tarfile.TarFile], None]:
    def add(tar: tarfile.TarFile) -> None:
        good = tarfile.TarInfo("proj/before.txt")
        good.size = 2
        tar.addfile(good, io.BytesIO(b"ok"))
        info = tarfile.TarInfo(name)
        info.type, info.linkname = kind, link
        info.size = len(data) if kind == tarfile.REGTYPE else 0
        tar.addfile(info, io.BytesIO(data) if kind == tarfile.REGTYPE else None)
        after = tarfile.TarInfo("proj/after.txt")
        after.size = 2
        tar.addfile(after, io.BytesIO(b"no"))
    return add


def test_the_bots_archive_is_unpacked_by_the_launcher_then_it_reads_on(
        tmp_path: Path) -> None:
    workdir = tmp_path / "node"
    local = tmp_path / "big.bin"
    local.write_bytes(bytes(range(256)) * 9000 + b"\nsync\nlaunch\n")  # lines of the protocol
    chunks: list[bytes] = []
    seen: list[tuple[int, int]] = []
    sent = write_archive([(local, f"{workdir}/proj/a/big.bin"),
                          (b"{}", f"{workdir}/runs/r1/spec.json")], str(workdir),
                         chunks.append, lambda done, total: seen.append((done, total)))
    total = local.stat().st_size + 2
    assert sent == total and seen[0] == (0, total) and seen[-1] == (total, total)
    with launcher(workdir, "sh", "-c", "cat proj/a/big.bin > out.bin") as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"tar\n" + b"".join(chunks) + b"sync\n")
        proc.stdin.flush()
        assert json.loads(proc.stdout.readline()) == {"failed": []}
        proc.stdin.write(b"launch\n")
        proc.stdin.close()
        assert int(proc.stdout.read().strip()) > 1
    assert (workdir / "runs" / "r1" / "spec.json").read_bytes() == b"{}"
    assert (workdir / "proj" / "a" / "big.bin").read_bytes() == local.read_bytes()


@pytest.mark.parametrize(("name", "kind", "link", "why"), [
    ("proj/key", tarfile.SYMTYPE, "/home/bot/.ssh/id_ed25519", "a link"),
    ("proj/hard", tarfile.LNKTYPE, "proj/before.txt", "a link"),
    ("/tmp/evil.txt", tarfile.REGTYPE, "", "an absolute path"),
    ("proj/../../evil.txt", tarfile.REGTYPE, "", "'..' in its path"),
    ("proj/fifo", tarfile.FIFOTYPE, "", "not a regular file or a folder"),
    ("proj/dev", tarfile.CHRTYPE, "", "not a regular file or a folder"),
])
def test_a_malicious_member_is_refused_by_the_launcher_naming_it(
        tmp_path: Path, name: str, kind: bytes, link: str, why: str) -> None:
    workdir = tmp_path / "node"
    stream = framed(archive(member(name, kind=kind, link=link)))
    with launcher(workdir, "true") as proc:
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(b"tar\n" + stream + b"sync\n")
        proc.stdin.flush()
        failed = json.loads(proc.stdout.readline())["failed"]
        proc.stdin.close()  # no launch: the lock is dropped
        proc.wait(30)
    assert failed == [f"archive member {name!r} refused: {why}"]
    assert (workdir / "proj" / "before.txt").read_bytes() == b"ok"
    assert not (workdir / "proj" / "after.txt").exists()  # nothing after the refusal
    assert not (tmp_path / "evil.txt").exists() and not (workdir / "proj" / "key").exists()
    assert not (workdir / "proj" / "hard").exists() and not (workdir / "proj" / "fifo").exists()


def test_a_file_whose_folder_is_a_link_out_of_the_workdir_is_refused(tmp_path: Path) -> None:
    workdir, outside = tmp_path / "node", tmp_path / "outside"
    (workdir / "proj").mkdir(parents=True)
    outside.mkdir()
    (workdir / "proj" / "cfg").symlink_to(outside)  # left by the team's code on the node
    stream = framed(archive(member("proj/cfg/authorized_keys", b"ssh-ed25519 AAAA")))
    failed = untar(str(workdir), Chunks(io.BytesIO(stream + b"sync\n")))
    assert failed == ["archive member 'proj/cfg/authorized_keys' refused: its folder leads "
                      "out through a link"]
    assert list(outside.iterdir()) == []


def test_a_file_left_as_a_link_is_replaced_never_written_through(tmp_path: Path) -> None:
    workdir, target = tmp_path / "node", tmp_path / "bashrc"
    (workdir / "proj").mkdir(parents=True)
    target.write_text("mine")
    (workdir / "proj" / "run.py").symlink_to(target)
    raw = io.BytesIO(framed(archive(member("proj/run.py", b"print(1)"))) + b"sync\n")
    assert untar(str(workdir), Chunks(raw)) == []
    assert target.read_text() == "mine"
    assert (workdir / "proj" / "run.py").read_bytes() == b"print(1)"
    assert not (workdir / "proj" / "run.py").is_symlink()
    assert raw.readline() == b"sync\n"  # the archive is read to its end mark, no further


def test_a_stream_cut_in_the_middle_is_the_bot_gone(tmp_path: Path) -> None:
    stream = framed(archive(member("proj/x.bin", b"y" * 5000)))
    with pytest.raises(EOFError):
        untar(str(tmp_path), Chunks(io.BytesIO(stream[:3000])))


def test_the_start_message_shows_a_nodes_copy_under_way() -> None:
    from bot.messages.dispatch_view import node_line

    assert node_line({"node": "gpu-1:22", "index": 1, "phase": "uploading",
                      "bytes_done": 2_500_000, "bytes_total": 10_000_000}) == (
        "volume.nodes[1] gpu-1:22: sending its copy (2.5 of 10.0 MB)")


def test_new_files_and_files_already_there_are_both_written_whole(tmp_path: Path) -> None:
    """A file not on the node yet is created under its name; one already there is
    replaced through a temporary name; neither leaves a temporary file behind, and both
    get the member's mode whatever the umask."""
    workdir = tmp_path / "node"
    (workdir / "proj").mkdir(parents=True)
    (workdir / "proj" / "old.py").write_text("old")

    def add(tar: tarfile.TarFile) -> None:
        for name, data, mode in (("proj/old.py", b"new", 0o644), ("proj/new.sh", b"#!", 0o755),
                                 ("proj/deep/a/b.txt", b"b", 0o644)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

    old = os.umask(0o077)
    try:
        assert untar(str(workdir), Chunks(io.BytesIO(framed(archive(add))))) == []
    finally:
        os.umask(old)
    assert (workdir / "proj" / "old.py").read_bytes() == b"new"
    assert (workdir / "proj" / "new.sh").read_bytes() == b"#!"
    assert (workdir / "proj" / "deep" / "a" / "b.txt").read_bytes() == b"b"
    assert stat.S_IMODE((workdir / "proj" / "new.sh").stat().st_mode) == 0o755
    assert stat.S_IMODE((workdir / "proj" / "old.py").stat().st_mode) == 0o644
    assert sorted(p.name for p in (workdir / "proj").iterdir()) == ["deep", "new.sh", "old.py"]


@pytest.mark.parametrize("already_there", [False, True])
def test_a_file_cut_off_midway_is_never_left_half_written(tmp_path: Path,
                                                          already_there: bool) -> None:
    """The bot gone in the middle of a file: a new file is removed, a file that was there
    keeps its old bytes; no temporary file is left."""
    workdir = tmp_path / "node"
    (workdir / "proj").mkdir(parents=True)
    if already_there:
        (workdir / "proj" / "x.bin").write_bytes(b"before")
    stream = framed(archive(member("proj/x.bin", b"y" * 50_000)))
    with pytest.raises(EOFError):  # half the stream: inside x.bin's 50 kB
        untar(str(workdir), Chunks(io.BytesIO(stream[:len(stream) // 2])))
    left = sorted(p.name for p in (workdir / "proj").iterdir())
    if already_there:
        assert left == ["before.txt", "x.bin"]
        assert (workdir / "proj" / "x.bin").read_bytes() == b"before"
    else:
        assert left == ["before.txt"]


@pytest.mark.parametrize("name", ["a", "proj/src/app.py", "x" * 100, "x" * 101,
                                  "data/" + "long" * 40 + ".txt", "données/é.txt"])
@pytest.mark.parametrize(("size", "mode", "mtime"), [(0, 0o644, 0), (12_345, 0o755, 1_700_000_000),
                                                     (8 ** 11, 0o644, 5)])
def test_the_bots_headers_are_the_ones_tarfile_writes(name: str, size: int, mode: int,
                                                      mtime: int) -> None:
    """The bot writes a short ASCII name's header itself, byte for byte tarfile's; a long
    or non-ASCII name, or a size past the ustar field, gets tarfile's pax header."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = size, mode, mtime
    assert header(name, size, mode, mtime) == info.tobuf(tarfile.PAX_FORMAT, "utf-8",
                                                        "surrogateescape")


def test_the_bots_archive_reads_back_whole_with_tarfile(tmp_path: Path) -> None:
    """Every member (empty, a block exactly, long and non-ASCII names, bytes) comes back
    from the stdlib's stream reader with its name, mode and bytes, in order."""
    sources = {"proj/empty.txt": b"", "proj/block.bin": b"b" * 512, "proj/run.sh": b"#!/bin/sh\n",
               "proj/" + "d" * 120 + "/x.txt": b"deep", "proj/données.txt": "é".encode()}
    entries: list[tuple[Path | bytes, str]] = []
    for i, (name, data) in enumerate(sources.items()):
        local = tmp_path / f"src-{i}"
        local.write_bytes(data)
        local.chmod(0o755 if name.endswith(".sh") else 0o644)
        entries.append((local, f"/w/{name}"))
    entries.append((b"{}", "/w/runs/r1/spec.json"))
    chunks: list[bytes] = []
    assert write_archive(entries, "/w", chunks.append) == sum(map(len, sources.values())) + 2
    assert chunks[-1] == END
    raw = Chunks(io.BytesIO(b"".join(chunks)))
    got = []
    with tarfile.open(fileobj=raw, mode="r|") as tar:  # type: ignore[call-overload]
        for item in tar:
            fh = tar.extractfile(item)
            got.append((item.name, item.mode, fh.read() if fh is not None else None))
    assert got == [*((n, 0o755 if n.endswith(".sh") else 0o644, d) for n, d in sources.items()),
                   ("runs/r1/spec.json", 0o644, b"{}")]


def test_a_file_that_shrinks_while_it_is_sent_fails_naming_it(tmp_path: Path) -> None:
    local = tmp_path / "log.txt"
    local.write_bytes(b"x" * (CHUNK + 5000))

    def shrink(chunk: bytes) -> None:  # its first MiB is on its way: it is cut meanwhile
        local.write_bytes(b"x" * 10)

    with pytest.raises(DispatchError, match="log.txt: cannot send it .* did it change"):
        write_archive([(local, "/w/proj/log.txt")], "/w", shrink)
