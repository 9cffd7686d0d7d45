"""A node's file hashes: remembered across dispatches by stat, answered in bounded lines.

A resume or a second dispatch over 100,000 unchanged files reads none of them again
(``bot/node_programs/hashcache.py``); the launcher's answer is lines of at most 2,000 files
(``launcher.print_hashes``), each read by the bot under a cap (``read_lines``), the
whole checked by ``HashAnswer`` (count, names, a cap on files)."""

from __future__ import annotations

import asyncio
import io
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.corpus import corpus_command
from bot.dispatch.node_output import read_lines
from bot.errors import DispatchError
from bot.node_programs import NODE_CORPUS_SCRIPT
from bot.node_programs import hashcache as node_hashcache
from bot.node_programs.hashcache import HashCache, file_sha256
from bot.node_programs.launcher import HASH_LINE_FILES, hashes, print_hashes
from bot.nodes.ssh.answers import HashAnswer, parse_hashes

WHERE = "node 127.0.0.1:22"
OLD = 1_600_000_000  # a modification time far from "now": remembered


def files(folder: Path, count: int) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for n in range(count):
        path = folder / f"f-{n:05d}.txt"
        path.write_text(f"file {n}", encoding="utf-8")
        os.utime(path, (OLD, OLD))
        out.append(path)
    return out


def test_a_second_listing_reads_only_what_changed(tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(node_hashcache, "RACY_NS", 0)  # the files' change time is now
    made = files(tmp_path / "proj", 50)
    cache_file = tmp_path / "hash-cache.json"
    first = HashCache(str(cache_file))
    found = hashes([], [], [str(tmp_path / "proj")], None, first)
    first.save()
    assert first.read == 50 and len(found[str(tmp_path / "proj")]) == 50
    made[3].write_text("changed, same time", encoding="utf-8")
    os.utime(made[3], (OLD, OLD))  # the size (and change time) tell it apart anyway
    made[4].unlink()
    second = HashCache(str(cache_file))
    again = hashes([], [], [str(tmp_path / "proj")], None, second)
    second.save()
    assert second.read == 1
    assert again[str(tmp_path / "proj")]["f-00003.txt"] == file_sha256(str(made[3]))
    assert "f-00004.txt" not in again[str(tmp_path / "proj")]
    assert len(json.loads(cache_file.read_text())) == 49  # the gone file is forgotten


def test_a_file_changed_just_now_or_a_broken_memory_is_read_again(tmp_path: Path) -> None:
    fresh = tmp_path / "proj" / "fresh.txt"
    fresh.parent.mkdir()
    fresh.write_text("written this second", encoding="utf-8")
    cache_file = tmp_path / "hash-cache.json"
    cache = HashCache(str(cache_file))
    hashes([], [], [str(fresh.parent)], None, cache)
    cache.save()
    assert json.loads(cache_file.read_text()) == {}  # too recent to be trusted later
    cache_file.write_text("{not json")
    broken = HashCache(str(cache_file))
    assert hashes([], [], [str(fresh.parent)], None, broken)[str(fresh.parent)] == {
        "fresh.txt": file_sha256(str(fresh))} and broken.read == 1


def test_the_answer_is_bounded_lines_and_the_bot_checks_them(tmp_path: Path) -> None:
    root = str(tmp_path / "proj")
    files(tmp_path / "proj", HASH_LINE_FILES + 500)
    (tmp_path / "proj" / "skipped").mkdir()
    (tmp_path / "proj" / "skipped" / "x").write_text("x")
    out = io.StringIO()
    print_hashes(hashes([], [], [root, str(tmp_path / "empty")],
                        [str(tmp_path / "proj" / "skipped")], HashCache(None)), out)
    lines = out.getvalue().splitlines()
    assert len(lines) == 4 and json.loads(lines[-1]) == {"end": HASH_LINE_FILES + 500}
    assert max(len(line) for line in lines) < 1 << 20
    got = parse_hashes(out.getvalue(), WHERE, "python3", [root])
    assert len(got[root]) == HASH_LINE_FILES + 500 and "skipped/x" not in got[root]
    # a count that disagrees, a line cut off, too many files, a name out of the root
    with pytest.raises(DispatchError, match="end with 3"):
        parse_hashes("\n".join(lines[:-1] + ['{"end": 3}']), WHERE, "python3", [root])
    with pytest.raises(DispatchError, match="before their end line"):
        parse_hashes("\n".join(lines[:-1]), WHERE, "python3", [root])
    with pytest.raises(DispatchError, match="more than 100 files"):
        answer = HashAnswer(WHERE, "python3", [root], max_files=100)
        for line in lines:
            answer.feed(line)
    with pytest.raises(DispatchError, match=WHERE):
        HashAnswer(WHERE, "python3", [root]).feed(json.dumps(
            {"root": root, "files": {"../../home/bot/.ssh/id_ed25519": "x"}}))
    with pytest.raises(DispatchError, match="did not print the file hashes"):
        HashAnswer(WHERE, "python3").feed("Welcome to Ubuntu")


class Stream:
    """An SSH stream's ``read``: the text in small chunks."""

    def __init__(self, data: bytes, chunk: int = 7) -> None:
        self.data, self.chunk = data, chunk

    async def read(self, n: int) -> bytes:
        part, self.data = self.data[:min(n, self.chunk)], self.data[min(n, self.chunk):]
        return part


def test_lines_are_read_under_a_cap_and_what_follows_is_handed_back() -> None:
    seen: list[str] = []

    def take(line: str) -> bool:
        seen.append(line)
        return line == "end"

    after = asyncio.run(read_lines(Stream(b"a\nbb\nend\nmore"), take, cap=16))
    assert seen == ["a", "bb", "end"] and after == b"more"
    assert asyncio.run(read_lines(Stream(b"x" * 100 + b"\n"), take, cap=16)) is None
    with pytest.raises(EOFError):
        asyncio.run(read_lines(Stream(b"a\nb"), take, cap=16))


def test_the_node_s_corpus_listing_remembers_its_digests(tmp_path: Path) -> None:
    made = files(tmp_path / "corpus", 5)
    workdir = tmp_path / "work"
    command = corpus_command(sys.executable, str(tmp_path / "corpus"), "f-*.txt", "",
                             str(workdir))
    args = command.split(" ")
    cache_arg = args[-1]
    assert cache_arg.startswith(str(workdir / "cache" / "corpus-"))

    def listing() -> dict[str, Any]:
        done = subprocess.run([sys.executable, "-c", NODE_CORPUS_SCRIPT, str(tmp_path / "corpus"),
                               "f-*.txt", "", cache_arg], capture_output=True, text=True,
                              check=True)
        header, *rows = done.stdout.splitlines()  # the header, then one row a line
        return {**json.loads(header), "files": [json.loads(r) for r in rows]}

    time.sleep(node_hashcache.RACY_NS / 1e9 + 0.1)  # their change time (utime) is past
    first = listing()
    memory = json.loads(Path(cache_arg).read_text())
    assert first["count"] == 5 and len(memory) == 5
    # the memory is used: a digest planted in it comes back while the stat agrees ...
    memory[str(made[0])][4] = "planted"
    Path(cache_arg).write_text(json.dumps(memory))
    rows = listing()["files"]
    assert rows[0][2] == "planted"
    # ... and a file whose stat changed is read again
    os.utime(made[0], (OLD + 10, OLD + 10))
    rows = listing()["files"]
    assert rows[0][2] == file_sha256(str(made[0]))
