"""A corpus only the nodes hold (issue 23): ``volume.inputs.on_nodes`` without
``volume.inputs.dir``. The manifest accepts it (and names the field of a wrong combination),
the forecast before approval says its count is the manifest's, not a listing, the head node
lists it at dispatch (the count, ids and refusals checked there; every other node compared
with the head's listing), and the service takes the balance's ids from that listing.

The node's listing runs as a real subprocess (``LocalRuns``: the command the SSH dispatcher
would run on the node, run here, with this interpreter as the node's)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from bot.dispatch.base import RunHandle
from bot.dispatch.corpus import LISTING_FILE, Reference, check_listing, corpus_command, head_rows
from bot.dispatch.corpus_head import list_on_head
from bot.dispatch.upload import SSHNode
from bot.errors import DispatchError
from bot.node_programs.corpus_listing import listing_digest
from bot.nodes.ssh.adapter import SSHAdapter
from tests.bot.manifest_helpers import dump, load, locs, make_project, merged
from tests.bot.runs import run_of

NODE = {"kind": "ssh", "host": "gpu-1.example.net", "port": 2222, "user": "gpu"}
NODES = [NODE, {**NODE, "host": "gpu-2.example.net"}]


def node_only(on_nodes: Any = "/data/corpus", **inputs: Any) -> dict[str, Any]:
    return {"inputs": {"pattern": "doc-*.txt", "expected_count": 3, "on_nodes": on_nodes,
                       **inputs}, "nodes": NODES}


def test_on_nodes_alone_is_a_volume_whose_corpus_only_the_nodes_hold(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    loaded = load(root, dump(merged(node=NODE, hardware={"lots": 2}, volume=node_only())))
    inputs = loaded.manifest.volume.inputs  # type: ignore[union-attr]
    assert inputs.dir is None and inputs.on_nodes == "/data/corpus"
    assert loaded.listing(inputs).files == []  # nothing listed on the bot host


def test_neither_dir_nor_on_nodes_names_the_field_and_its_line(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    found = locs(root, dump(merged(node=NODE, hardware={"lots": 2},
                                   volume=node_only(on_nodes=None))))
    problem = found["volume.inputs.dir"]
    assert "required: the corpus's folder under project.dir" in problem.message
    assert "volume.inputs.on_nodes instead" in problem.message and problem.line


def test_frames_of_a_corpus_only_the_nodes_hold_are_refused(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    found = locs(root, dump(merged(node=NODE, hardware={"lots": 2},
                                   volume=node_only(frames="1-10"))))
    assert "cannot be counted before dispatch" in found["volume.inputs.frames"].message


def test_on_nodes_alone_on_this_machine_is_refused(tmp_path: Path) -> None:
    root = make_project(tmp_path)
    local = merged(node={"kind": "local"}, volume={**node_only(), "nodes": [{"kind": "local"}]})
    assert "runs on this machine" in locs(root, dump(local))["volume.inputs.on_nodes"].message


def test_the_forecast_says_its_count_is_the_manifests_until_the_nodes_list_it() -> None:
    from bot.service.forecast_inputs import _volume_inputs

    run = run_of(project_dir="/nonexistent", node={"kind": "ssh"})
    count, size, largest, where, error = _volume_inputs(run, node_only())
    assert (count, size, largest, error) == (3, None, None, None)
    assert where.startswith("counted from volume.inputs.expected_count 3; the corpus is only "
                            "on the nodes (volume.inputs.on_nodes /data/corpus)")
    from dataclasses import replace

    from bot.pilot.forecast import forecast
    from tests.bot.test_forecast import h100

    fc = forecast(replace(h100(volume_count=3, volume_bytes=None), volume_where=where,
                          volume_listed=False))
    assert fc.possible and fc.figure("volume").value == "3 items, size unknown"
    assert fc.figure("volume").formula.startswith("not listed: counted from volume.inputs")
    assert any("not a listing" in note for note in fc.notes)


class LocalRuns:
    """Runs a node's command here, as a real subprocess (this interpreter as the node's)."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def run(self, node: SSHNode, command: str, stdin: str = "",
            timeout: float = 120, cap: int = 0) -> tuple[int, str, str]:
        self.commands.append(command)
        done = subprocess.run(command, shell=True, input=stdin, capture_output=True,
                              text=True, timeout=timeout)
        return done.returncode, done.stdout, done.stderr


def corpus(root: Path, names: tuple[str, ...] = ("doc-1.txt", "doc-2.txt", "doc-3.txt")
           ) -> Path:
    folder = root / "nodes-corpus"
    folder.mkdir(exist_ok=True)
    for name in names:
        (folder / name).write_text(f"text of {name}", encoding="utf-8")
    return folder


def handle_for(tmp_path: Path, folder: Path, **inputs: Any) -> tuple[RunHandle, list[Any]]:
    run_dir = tmp_path / "run"
    run_dir.mkdir(exist_ok=True)
    volume = node_only(on_nodes=str(folder), **inputs)
    (run_dir / "manifest.yaml").write_text(dump({"volume": volume}), encoding="utf-8")
    spec = {"volume": {"gpus": False}, "inputs": {
        "dir": str(folder), "pattern": "doc-*.txt", "expected_count":
        volume["inputs"]["expected_count"],
        "expected_refusals": volume["inputs"].get("expected_refusals", [])}}
    (run_dir / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    steps: list[Any] = []
    return RunHandle("r1", run_dir, run_dir / "spec.json", tmp_path,
                     progress=steps.append), steps


HEAD = SSHNode(host="gpu-1.example.net", workdir="/w", port=2222, user="gpu",
               python=sys.executable)


def test_the_head_lists_the_corpus_and_every_other_node_is_held_to_it(tmp_path: Path) -> None:
    folder = corpus(tmp_path)
    handle, steps = handle_for(tmp_path, folder)
    assert list_on_head(SSHAdapter(LocalRuns(), HEAD), handle) == 3
    rows = head_rows(handle.run_dir)
    assert [r[0] for r in rows] == ["doc-1.txt", "doc-2.txt", "doc-3.txt"]
    # the listing kept as JSON Lines: a header, then one row a line
    header, *lines = (handle.run_dir / LISTING_FILE).read_text().splitlines()
    stored = json.loads(header)
    assert stored["count"] == 3 and [tuple(json.loads(line)) for line in lines] == rows
    assert stored["node"] == "gpu@gpu-1.example.net:2222" and stored["on_nodes"] == str(folder)
    assert steps == [{"node": "gpu@gpu-1.example.net:2222", "index": 0, "phase": "listed",
                      "count": 3, "bytes": sum(r[1] for r in rows)}]
    # another node with the same corpus agrees; one whose copy differs is refused, naming
    # the head's listing and the first input that differs
    command = corpus_command(sys.executable, str(folder), "doc-*.txt", listing_digest(rows))
    out = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
    check_listing("gpu@gpu-2.example.net:2222", str(folder), Reference.of(rows), out,
                  head=stored["node"])
    (folder / "doc-2.txt").write_text("another text", encoding="utf-8")
    out = subprocess.run(command, shell=True, capture_output=True, text=True).stdout
    with pytest.raises(DispatchError) as refused:
        check_listing("gpu@gpu-2.example.net:2222", str(folder), Reference.of(rows), out,
                      head=stored["node"])
    assert "differs from the head node gpu@gpu-1.example.net:2222's listing: first " \
           "differing input 'doc-2' (doc-2.txt: its size differs)" in str(refused.value)
    assert "make every node's copy equal to the head's" in str(refused.value)


@pytest.mark.parametrize(("names", "inputs", "why"), [
    (("doc-1.txt", "doc-2.txt"), {}, "holds 2 input(s), volume.inputs.expected_count says 3"),
    (("doc-1.txt", "doc-1.json", "doc-2.txt"), {"pattern": "doc-*"},
     "input id 'doc-1' is given by two files"),
    (("doc-1.txt", "doc-2.txt", "doc-3.txt"), {"expected_refusals": ["doc-9"]},
     "volume.inputs.expected_refusals names 'doc-9', which is not among its inputs"),
])
def test_the_heads_listing_is_held_to_the_manifests_rules(
        tmp_path: Path, names: tuple[str, ...], inputs: dict[str, Any], why: str) -> None:
    folder = corpus(tmp_path, names)
    handle, steps = handle_for(tmp_path, folder, **{k: v for k, v in inputs.items()
                                                    if k != "pattern"})
    if "pattern" in inputs:
        spec = json.loads(handle.spec_path.read_text())
        spec["inputs"]["pattern"] = inputs["pattern"]
        handle.spec_path.write_text(json.dumps(spec))
    with pytest.raises(DispatchError) as refused:
        list_on_head(SSHAdapter(LocalRuns(), HEAD), handle)
    assert why in str(refused.value) and "volume.nodes[0] (gpu@gpu-1.example.net:2222)" in \
        str(refused.value)
    assert not (handle.run_dir / LISTING_FILE).exists() and steps == []


def test_a_head_without_the_folder_is_refused_saying_so(tmp_path: Path) -> None:
    handle, _ = handle_for(tmp_path, tmp_path / "absent")
    with pytest.raises(DispatchError, match=r"volume.inputs.on_nodes .*absent cannot be listed "
                                            "on the head node"):
        list_on_head(SSHAdapter(LocalRuns(), HEAD), handle)


def test_a_corpus_the_bot_holds_is_not_listed_on_the_head(tmp_path: Path) -> None:
    folder = corpus(tmp_path)
    handle, steps = handle_for(tmp_path, folder, dir="data/pilote")
    runs = LocalRuns()
    assert list_on_head(SSHAdapter(runs, HEAD), handle) is None
    assert runs.commands == [] and steps == []


def test_through_the_service_the_heads_listing_gives_the_volume_its_ids_and_count(
        tmp_path: Path) -> None:
    """A pilot whose volume's corpus only the nodes hold: its forecast counts the manifest's
    40 (not a listing), the approval needs no folder on the bot host, and at dispatch the
    head's listing gives the volume run the ids its balance expects and the forecast on the
    proven nodes its count and bytes."""
    from tests.bot import test_forecast_proven_service as kit

    folder = corpus(tmp_path, tuple(f"vol-{n:04d}.txt" for n in range(1, 41)))
    listed = [f"vol-{n:04d}" for n in range(1, 41)]

    class HeadListing(kit.ProvingDispatcher):
        def start(self, handle: Any) -> int | None:
            if json.loads(Path(handle.spec_path).read_text(encoding="utf-8")).get("volume"):
                # what the SSH dispatcher does first
                list_on_head(SSHAdapter(LocalRuns(), HEAD), handle)
            return super().start(handle)

    original = kit.VOLUME_IDS
    kit.VOLUME_IDS = listed
    try:
        path = kit.manifest(tmp_path)
        text = path.read_text(encoding="utf-8").replace(
            'inputs: {dir: data/volume, pattern: "vol-*.txt", expected_count: 600}',
            f'inputs: {{on_nodes: "{folder}", pattern: "vol-*.txt", expected_count: 40}}')
        path.write_text(text, encoding="utf-8")
        service, dispatcher, notifier, pilot, volume = kit.approved(
            tmp_path, dispatcher=HeadListing())
        before = service.store.get_run(pilot)["forecast"]
        assert before["volume_count"] == 40 and before["volume_bytes"] is None
        assert before["figures"][0]["formula"].startswith(
            "not listed: counted from volume.inputs.expected_count 40; the corpus is only on "
            f"the nodes (volume.inputs.on_nodes {folder})")
        run = service.store.get_run(volume)
        assert service.store.expected_ids(volume) == listed  # the head's listing, not ours
        spec = json.loads(Path(run["spec_path"]).read_text(encoding="utf-8"))
        assert spec["inputs"]["dir"] == str(folder)  # the runner lists it on the node
        fc = run["forecast"]
        assert fc["volume_count"] == 40 and fc["volume_bytes"] == sum(
            (folder / f"{i}.txt").stat().st_size for i in listed)
        assert fc["figures"][0]["formula"] == \
            "listed (on the head node gpu@gpu-1.example.net:2222 at the volume's dispatch)"
        shown = [getattr(b, "text", "") for m in notifier.history
                 if (m.run_id, m.key) == (volume, "dispatch") for b in m.blocks]
        assert any("volume.nodes[0] gpu@gpu-1.example.net:2222: corpus listed (40 inputs"
                   in line for line in shown)
        done = service.follower.follow(volume, timeout=30)
        assert done["balance"]["recheck"]["ok"] is True
        assert done["balance"]["recheck"]["total"] == 40
        # the balance is the nodes' word on both sides, and says so (issue 32)
        [check] = [c for c in done["verdict"]["checks"] if c["text"].startswith("balance")]
        assert "(node-listed: the inputs it expects were listed by the head node" in \
            check["text"]
        report = (Path(done["run_dir"]) / "report.html").read_text(encoding="utf-8")
        assert "Balance node-listed: the inputs it expects" in report
        from bot.messages.views import balance_message

        message = balance_message(service.store.run(volume))
        assert message is not None and "Balance node-listed" in repr(message.blocks)
    finally:
        kit.VOLUME_IDS = original
