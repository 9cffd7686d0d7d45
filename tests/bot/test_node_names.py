"""Every name a node hands back passes one check, and every write the fetch makes on the
bot host stays inside the folder it was given (issue 32, High 1)."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest

from bot.dispatch.corpus import Reference, check_listing, node_rows
from bot.dispatch.host_tree import HostDir
from bot.dispatch.node_names import NodeNameRefused, listed_names, node_name, node_relpath
from bot.errors import DispatchError
from bot.nodes.ssh.answers import parse_hashes

WHERE = "gpu@node-1:22"
BAD = ["", ".", "..", "../../victim.txt", "a/b", "/etc", "nul\0byte", None, 7, b"bytes"]


@pytest.mark.parametrize("name", BAD)
def test_a_name_that_is_not_one_plain_component_is_refused_naming_the_node(name: object) -> None:
    with pytest.raises(NodeNameRefused) as caught:
        node_name(name, WHERE, "/w/runs/r1")
    assert str(caught.value).startswith(f"{WHERE}: the node answered the name ")
    assert "in /w/runs/r1" in str(caught.value)
    assert "nothing was written or removed on the bot host" in str(caught.value)


def test_plain_names_pass_and_a_listing_drops_only_dot_and_dot_dot() -> None:
    for name in ("balance.csv", ".hidden", "..x", "x..", "a b", "é"):
        assert node_name(name, WHERE, "/w") == name
    assert listed_names([".", "..", "a", ".b"], WHERE, "/w") == ["a", ".b"]
    with pytest.raises(NodeNameRefused):
        listed_names([".", "..", "a", "../b"], WHERE, "/w")
    assert node_relpath("src/app.py", WHERE, "/w") == "src/app.py"
    for rel in ("src/../../x", "/abs", "a//b", "a/"):
        with pytest.raises(NodeNameRefused):
            node_relpath(rel, WHERE, "/w")


def test_the_node_s_file_hashes_are_checked_before_the_upload_removes_what_they_name() -> None:
    root = "/w/projects/p-1"
    def lines(*parts: tuple[str, object]) -> str:
        files = sum(len(f) for _r, f in parts if isinstance(f, (dict, list)))
        return "\n".join([json.dumps({"root": r, "files": f}) for r, f in parts]
                         + [json.dumps({"end": files})])

    good = lines((root, {"src/app.py": "ab" * 32}), ("/elsewhere", {"x": "y"}))
    assert parse_hashes(good, WHERE, "python3", [root]) == {root: {"src/app.py": "ab" * 32}}
    for files in ({"../../home/bot/.ssh/id_ed25519": "x"}, ["a"], {"a": 1}):
        with pytest.raises(DispatchError, match=WHERE):
            parse_hashes(lines((root, files)), WHERE, "python3", [root])


def test_a_corpus_listing_s_rows_are_typed_and_their_names_plain() -> None:
    assert node_rows([["a.txt", 3, "f" * 64]], WHERE, "/data") == [("a.txt", 3, "f" * 64)]
    for rows in ([["../a.txt", 3, "f" * 64]], [["a.txt", -1, "f"]], [["a.txt", "3", "f"]],
                 [["a.txt", 3]], ["a.txt"], {"a": 1}, [["a.txt", True, "f"]]):
        with pytest.raises(DispatchError, match=WHERE):
            node_rows(rows, WHERE, "/data")
    reply = json.dumps({"count": 1, "digest": "other"}) + "\n" + json.dumps(["../x", 1, "f"])
    with pytest.raises(NodeNameRefused):
        check_listing(WHERE, "/data", Reference.of([("x", 1, "f")]), reply)


def test_writes_below_a_host_dir_never_leave_it(tmp_path: Path) -> None:
    (tmp_path / "outside").write_text("kept\n")
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "link").symlink_to(tmp_path)
    with HostDir(tmp_path / "run") as run, run.fresh(".fetch") as staging:
        for parts in (("..", "outside"), ("a/../..", "x"), ("",), (".",)):
            with pytest.raises(OSError):
                staging.create(parts)
        with pytest.raises(OSError) as caught:  # a link on the way is never followed
            run.create(("link", "outside"))
        assert caught.value.errno in (errno.ELOOP, errno.ENOTDIR)
        staging.mkdir(("d",))
        fd = staging.create(("d", "f.txt"))
        os.write(fd, b"fetched")
        os.close(fd)
        with pytest.raises(OSError):  # a new file is new: never one already there
            staging.create(("d", "f.txt"))
        (tmp_path / "run" / "d").mkdir()
        (tmp_path / "run" / "d" / "old").write_text("old")
        staging.replace_into("d", run, "d")
        with pytest.raises(OSError):
            run.remove("../outside")
        run.remove("link")  # the link itself, never where it leads
    assert (tmp_path / "run" / "d" / "f.txt").read_bytes() == b"fetched"
    assert not (tmp_path / "run" / "d" / "old").exists()
    assert (tmp_path / "outside").read_text() == "kept\n" and (tmp_path / "run").is_dir()
    assert not (tmp_path / "run" / "link").exists()
