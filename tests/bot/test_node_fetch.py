"""The node-agnostic fetch's evidence copy (``bot/dispatch/node_fetch.py``) against a node
whose answers are the team's: a file that differs from its ``SHA256SUMS`` line, or a name
that leads out of the copy, refuses the fetch naming it, and the evidence home the bot host
had is left as it was (no staging folder left behind); a home inside the runs folder is
refused before anything is read. A fake ``Node`` over a dict of files (no process)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.evidence_home import EvidenceHomeRefused
from bot.dispatch.node_fetch import fetch_over_node
from bot.dispatch.node_names import NodeNameRefused
from bot.errors import DispatchError

RUN_DIR, EVIDENCE = "/node/runs/r-1", "/node/evidence/tag"


class FilesNode:
    """A node holding ``files`` (its path -> bytes): it lists and reads them."""

    where = "fake gpu-1"
    python = "python3"

    def __init__(self, files: dict[str, bytes], listed: dict[str, list[str]] | None = None
                 ) -> None:
        self.files = files
        self.listed = listed or {}
        self.read: list[str] = []

    def run(self, command: str, stdin: bytes = b"", timeout: float = 120.0,
            cap: int | None = None) -> tuple[int, str, str]:
        folder = command.rsplit(" ", 1)[1]
        names = self.listed.get(folder)
        if names is None:
            names = sorted(p[len(folder) + 1:] for p in self.files
                           if p.startswith(folder + "/"))
        return 0, json.dumps(names), ""

    def read_file(self, path: str, offset: int = 0, size: int | None = None) -> bytes:
        self.read.append(path)
        return self.files[path]


def _sums(files: dict[str, bytes]) -> bytes:
    return "".join(f"{hashlib.sha256(d).hexdigest()}  {n}\n" for n, d in files.items()).encode()


def _setup(tmp_path: Path, copy: dict[str, bytes], sums: dict[str, bytes]
           ) -> tuple[RunHandle, dict[str, object], dict[str, bytes], Path]:
    run_dir = tmp_path / "runs" / "r-1"
    run_dir.mkdir(parents=True)
    handle = RunHandle("r-1", run_dir, run_dir / "spec.json", tmp_path)
    files = {f"{RUN_DIR}/events.jsonl": b"{}\n",
             **{f"{EVIDENCE}/r-1/{n}": d for n, d in copy.items()},
             f"{EVIDENCE}/r-1/SHA256SUMS": _sums(sums)}
    home = tmp_path / "evidence" / "r-1"
    home.mkdir(parents=True)
    (home / "kept.txt").write_text("the copy the bot host had")
    layout: dict[str, object] = {"run_dir": RUN_DIR, "python": "python3",
                                 "evidence": {"local": str(home.parent), "remote": EVIDENCE}}
    return handle, layout, files, home


def _untouched(home: Path) -> None:
    assert [p.name for p in home.iterdir()] == ["kept.txt"]
    assert not [p for p in home.parent.iterdir() if p.name.startswith(".fetch")]


def test_a_file_that_differs_from_its_sums_line_refuses_the_fetch(tmp_path: Path) -> None:
    handle, layout, files, home = _setup(tmp_path, {"balance.json": b'{"total": 4}'},
                                         {"balance.json": b'{"total": 5}'})
    with pytest.raises(DispatchError, match=r"evidence copy's 'balance.json' from fake gpu-1 "
                                            r"differs from its line in SHA256SUMS"):
        fetch_over_node(handle, FilesNode(files), layout)
    _untouched(home)
    assert (handle.run_dir / "events.jsonl").read_bytes() == b"{}\n"  # the run dir came


def test_a_name_leading_out_of_the_copy_is_refused_naming_the_node(tmp_path: Path) -> None:
    handle, layout, files, home = _setup(tmp_path, {}, {})
    node = FilesNode(files, {f"{EVIDENCE}/r-1": ["SHA256SUMS", "../../escape"]})
    with pytest.raises(NodeNameRefused, match="fake gpu-1: the node answered the name '..'"):
        fetch_over_node(handle, node, layout)
    _untouched(home)
    assert not (tmp_path / "escape").exists()


def test_a_home_in_the_runs_folder_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    handle, layout, files, _home = _setup(tmp_path, {}, {})
    layout["evidence"] = {"local": str(tmp_path / "runs"), "remote": EVIDENCE}
    node = FilesNode(files)
    with pytest.raises(EvidenceHomeRefused):
        fetch_over_node(handle, node, layout)
    assert node.read == []


def test_a_run_that_left_no_evidence_copy_brings_back_its_run_directory(
        tmp_path: Path) -> None:
    handle, layout, files, home = _setup(tmp_path, {}, {})
    files = {p: d for p, d in files.items() if not p.startswith(EVIDENCE)}
    assert fetch_over_node(handle, FilesNode(files), layout) is None
    assert (handle.run_dir / "events.jsonl").is_file()
    _untouched(home)
