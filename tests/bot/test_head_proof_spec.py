"""The head's spec names its card proof of this dispatch, and the head's runner takes the
card stages from it (issue 23): the dispatcher's side (``read_proof``, ``head_proof``) on
the stdout of a real ladder run, read back by the runner's rule (``runner.proven``)."""

from __future__ import annotations

import io
import json
from pathlib import Path

from bot.dispatch.card_proof import PROOF_DIR, NodeCopy, head_proof, read_proof
from bot.dispatch.upload import SSHNode
from runner import events as ev
from runner.ladder import Ladder
from runner.proven import proof_stages
from runner.spec import RunSpec
from runner.stage import StageDef

STAGES = "tests.runner.test_head_proof_reuse"
NODE = SSHNode(host="10.0.0.1", workdir="/w")


def test_the_head_spec_names_the_proof_that_just_ran_on_its_node(tmp_path: Path) -> None:
    spec = {"run_id": "v1", "name": "vol", "inputs": {"dir": str(tmp_path)},
            "volume": {"gpus": True}}
    copy = NodeCopy(str(tmp_path / "run"), str(tmp_path / "pkg"), str(tmp_path))
    proof_dir = Path(copy.run_dir) / PROOF_DIR
    proof_dir.mkdir(parents=True)
    table = [StageDef("device", f"{STAGES}:device"),
             StageDef("compute", f"{STAGES}:compute", ("device",)),
             StageDef("interconnect", f"{STAGES}:interconnect", ("compute",))]
    stdout = io.StringIO()
    writer = ev.EventWriter(str(proof_dir / "events.jsonl"), "v1", echo=stdout)
    try:
        finished = Ladder(RunSpec.from_dict(spec), str(tmp_path / "p.json"), str(proof_dir),
                          False, writer, table).run()
        writer.emit(ev.RUN_FINISHED, **finished)
    finally:
        writer.close()
    out = stdout.getvalue()
    proof = read_proof(0, NODE, False, 0, out, "")
    last = [json.loads(line) for line in out.splitlines()][-1]
    assert last["type"] == ev.RUN_FINISHED and proof.finished_at == last["ts"]
    named = head_proof(copy, "v1", proof)
    assert named == {"dir": str(proof_dir), "run": "v1", "finished_at": last["ts"]}
    assert "finished_at" not in proof.to_dict()  # the spec's volume.nodes is unchanged
    head = RunSpec.from_dict({**spec, "volume": {**spec["volume"], "head_proof": named}})
    assert sorted(proof_stages(head)) == ["compute", "device", "interconnect"]


def test_a_proof_that_did_not_finish_is_not_named() -> None:
    copy = NodeCopy("/w/run", "/w/pkg", "/w")
    out = json.dumps({"type": "stage.passed", "stage": "device", "run": "v1",
                      "facts": {"device": "cpu"}}) + "\n"
    proof = read_proof(0, NODE, False, 0, out, "")
    assert head_proof(copy, "v1", proof) is None
