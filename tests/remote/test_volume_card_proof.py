"""The card proof of each volume node, read from recorded runner output (a fake of the
dispatcher's ``run``, no SSH, no GPU): the exact ``ray start`` a node gets for its healthy
cards, a faulty card excluded and told to the user, a node with no healthy card or a failed
stage refused before any Ray starts. And the runner's ``--stages`` subset, for real."""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.console.render import to_text
from bot.dispatch.base import RunHandle
from bot.dispatch.card_proof import NodeCopy
from bot.dispatch.volume_cluster import CLUSTER_FILE, start_volume_cluster
from bot.errors import DispatchError, NodeUnreachable
from bot.messages.volume_view import volume_message
from runner.events import Event
from runner.raypin import RAY_VERSION
from runner.spec import healthy_cards
from runner.stage import StageContext
from runner.volume import report_node_proofs
from tests.bot.runs import run_of
from tests.remote.remote_kit import command_kind, nodes_through
from tests.runner.test_stages_kit import REPO, runner_env
from tests.volume.kit import events, make_volume

HOSTS = ("gpu-a", "gpu-b")
ECC = "3 volatile uncorrected ECC error(s)"


def _line(stage: str, kind: str, facts: dict[str, Any], error: dict[str, Any] | None = None,
          **extra: Any) -> str:
    event = {"type": f"stage.{kind}", "stage": stage, "facts": facts, **extra}
    if error:
        event["error"] = {"where": None, "hint": None, **error}
    return json.dumps(event) + "\n"


def gpu_proof(count: int, *, faulty: dict[int, str] | None = None,
              wrong: dict[int, str] | None = None) -> str:
    """What ``python -m runner --stages ...`` prints on a node of ``count`` cards: ``faulty``
    cards fail the device stage (CardFault), ``wrong`` ones the compute stage (WrongResult)."""
    faulty, wrong = faulty or {}, wrong or {}
    rows = {str(c): {"verdict": "fault" if c in faulty else "ok",
                     "reasons": [faulty[c]] if c in faulty else []} for c in range(count)}
    healthy = [c for c in range(count) if c not in faulty]
    device = {"device": "cuda", "count": count, "cards": rows, "healthy_cards": healthy}
    out = _line("torch", "passed", {"version": "2.5.1", "cuda": "12.4"})
    if faulty:
        message = "; ".join(f"GPU {c}: {r}" for c, r in faulty.items())
        out += _line("device", "failed", device, {"type": "CardFault", "message": message})
        for stage in ("compute", "interconnect"):
            out += _line(stage, "skipped", {}, reason="device failed", blocking=True)
        return out
    out += _line("device", "passed", device)
    compute_rows = {str(c): {"verdict": "fault" if c in wrong else "ok",
                             "reasons": [wrong[c]] if c in wrong else []} for c in healthy}
    compute = {"cards": compute_rows, "healthy_cards": [c for c in healthy if c not in wrong]}
    if wrong:
        message = "; ".join(f"GPU {c}: {r}" for c, r in wrong.items())
        out += _line("compute", "failed", compute, {"type": "WrongResult", "message": message})
        return out + _line("interconnect", "skipped", {}, reason="compute failed",
                           blocking=True)
    out += _line("compute", "passed", compute)
    return out + _line("interconnect", "passed", {"healthy_cards": compute["healthy_cards"]})


class _Nodes:
    """Nodes with the pinned Ray whose card stages printed ``proofs[host]``."""

    def __init__(self, proofs: dict[str, str], cores: dict[str, int] | None = None) -> None:
        self.proofs = proofs
        self.cores = cores or {}
        self.ran: list[tuple[str, str, str]] = []

    def run(self, node: Any, command: str, stdin: str = "",
            timeout: float = 120) -> tuple[int, str, str]:
        kind = command_kind(command)
        self.ran.append((kind, node.host, command))
        if kind == "proof":
            out = self.proofs[node.host]
            return (1 if '"stage.failed"' in out else 0), out, ""
        return 0, json.dumps({"python": "3.11.9", "ray": RAY_VERSION,
                              "cpus": self.cores.get(node.host, 8)}), ""

    def started(self, host: str) -> list[str]:
        return [c for k, h, c in self.ran if k == "start" and h == host]


def _handle(tmp_path: Path) -> tuple[RunHandle, list[NodeCopy]]:
    nodes = [{"kind": "ssh", "host": h, "workdir": f"/srv/{h}"} for h in HOSTS]
    (tmp_path / "manifest.yaml").write_text(yaml.safe_dump({"volume": {"nodes": nodes}}))
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({"volume": {"gpus": True}}))
    copies = [NodeCopy(f"/srv/{h}/runs/r-1", f"/srv/{h}/runner-pkg", f"/srv/{h}/projects/p")
              for h in HOSTS]
    return RunHandle("r-1", tmp_path, spec, tmp_path, node=nodes[0]), copies


def _argv(command: str) -> list[str]:
    return shlex.split(command.split(" && exec ", 1)[1])


def test_each_node_starts_ray_offering_exactly_the_cards_its_proof_left(
        tmp_path: Path) -> None:
    handle, copies = _handle(tmp_path)
    nodes = _Nodes({"gpu-a": gpu_proof(4), "gpu-b": gpu_proof(2)})
    cluster = start_volume_cluster(nodes_through(nodes), handle, copies)
    assert cluster is not None
    assert [k for k, _, _ in nodes.ran] == ["proof"] * 2 + ["probe"] * 2 + ["start"] * 2
    for host, cards, role in (("gpu-a", "0,1,2,3", ["--head", "--port", "6380"]),
                              ("gpu-b", "0,1", ["--address", "gpu-a:6380"])):
        [command] = nodes.started(host)
        env = command.split(" && exec ", 1)[0]
        assert f" CUDA_VISIBLE_DEVICES={cards} " in env
        assert f" PYTHONPATH=/srv/{host}/runner-pkg${{PYTHONPATH:+:$PYTHONPATH}} " in env
        assert f" PREFLIGHT_NODE_RUN_DIR=/srv/{host}/runs/r-1 " in env
        assert env.endswith(f" PREFLIGHT_NODE_WHERE={host}:22")  # how its workers name it
        argv = _argv(command)
        at = argv.index("--num-gpus")
        assert argv[at + 1] == str(len(cards.split(",")))
        assert " ".join(role) in " ".join(argv)
    proofs = json.loads(handle.spec_path.read_text())["volume"]["nodes"]
    assert [(p["host"], p["cards"], p["excluded"]) for p in proofs] == [
        ("gpu-a", [0, 1, 2, 3], []), ("gpu-b", [0, 1], [])]


def test_a_cpu_node_with_more_cores_than_the_worker_port_range_gets_a_port_per_worker(
        tmp_path: Path) -> None:
    """A CPU volume starts one Ray worker per core of the cluster, each on a port of its
    node's worker range: a 128-core node's range holds 128 workers and some to spare, a
    small node keeps the pinned 11000-11063."""
    handle, copies = _handle(tmp_path)
    handle.spec_path.write_text(json.dumps({"volume": {"gpus": False}}))
    nodes = _Nodes({h: _line("torch", "passed", {}) + _line("device", "passed",
                                                           {"device": "cpu"})
                    for h in HOSTS}, cores={"gpu-a": 4, "gpu-b": 128})
    assert start_volume_cluster(nodes_through(nodes), handle, copies) is not None
    ranges = {}
    for host in HOSTS:
        [command] = nodes.started(host)
        argv = _argv(command)
        low = int(argv[argv.index("--min-worker-port") + 1])
        high = int(argv[argv.index("--max-worker-port") + 1])
        ranges[host] = (low, high)
        assert argv[argv.index("--num-gpus") + 1] == "0"  # CPUs only
    assert ranges["gpu-a"] == (11000, 11063)
    low, high = ranges["gpu-b"]
    assert low == 11000 and high - low + 1 >= 128 + 16


def test_a_card_stage_that_passed_with_its_verdict_kept_excludes_the_card(
        tmp_path: Path) -> None:
    """What the runner prints for a volume's spec: a card verdict passes the stage, the
    verdict kept in facts.card_verdict (runner.cards.tolerate_card_verdict), and the later
    card stages run on the healthy cards. The proof leaves the card out all the same."""
    handle, copies = _handle(tmp_path)
    verdict = {"type": "CardFault", "message": "GPU 1: 3 volatile uncorrected ECC error(s)"}
    device = {"device": "cuda", "count": 3, "cards": {"0": {}, "1": {}, "2": {}},
              "healthy_cards": [0, 2], "card_verdict": verdict}
    out = (_line("torch", "passed", {}) + _line("device", "passed", device)
           + _line("compute", "passed", {"healthy_cards": [0, 2]})
           + _line("interconnect", "passed", {"healthy_cards": [0, 2]}))
    nodes = _Nodes({"gpu-a": gpu_proof(2), "gpu-b": out})
    assert start_volume_cluster(nodes_through(nodes), handle, copies) is not None
    [command] = nodes.started("gpu-b")
    assert " CUDA_VISIBLE_DEVICES=0,2 " in command and "--num-gpus 2 " in command
    proof = json.loads(handle.spec_path.read_text())["volume"]["nodes"][1]
    assert proof["excluded"] == [{"card": 1, "stage": "device",
                                  "reason": verdict["message"]}]


def test_a_card_in_every_slow_pair_of_the_interconnect_is_left_out(tmp_path: Path) -> None:
    """The interconnect stage's ``cards`` are the list of cards it linked, not rows by card
    (found on the simulated 4 x 8 cluster: the proof failed with AttributeError)."""
    handle, copies = _handle(tmp_path)
    rows = {str(c): {"verdict": "ok", "reasons": []} for c in range(4)}
    link = {"cards": [0, 1, 2, 3], "healthy_cards": [0, 1, 3],
            "warnings": ["below the reference; card 2 is in every slow pair"]}
    out = (_line("torch", "passed", {})
           + _line("device", "passed", {"device": "cuda", "count": 4, "cards": rows,
                                         "healthy_cards": [0, 1, 2, 3]})
           + _line("compute", "passed", {"cards": rows, "healthy_cards": [0, 1, 2, 3]})
           + _line("interconnect", "passed", link))
    nodes = _Nodes({"gpu-a": gpu_proof(2), "gpu-b": out})
    assert start_volume_cluster(nodes_through(nodes), handle, copies) is not None
    [command] = nodes.started("gpu-b")
    assert " CUDA_VISIBLE_DEVICES=0,1,3 " in command and "--num-gpus 3 " in command
    proof = json.loads(handle.spec_path.read_text())["volume"]["nodes"][1]
    assert proof["excluded"] == [{"card": 2, "stage": "interconnect",
                                  "reason": link["warnings"][0]}]


def test_the_proof_reads_healthy_cards_by_the_runner_s_one_rule(tmp_path: Path) -> None:
    """A node's stages whose lists are not all card indices (a JSON true is no card, once
    read as card 1): the proof offers the cards runner.spec.healthy_cards reads, as the
    runner's volume does, never a card made of a boolean."""
    handle, copies = _handle(tmp_path)
    rows = {str(c): {"verdict": "ok", "reasons": []} for c in range(3)}
    device = {"device": "cuda", "count": 3, "cards": rows, "healthy_cards": [0, 2]}
    out = (_line("torch", "passed", {}) + _line("device", "passed", device)
           + _line("compute", "passed", {"cards": rows, "healthy_cards": [True, 2]})
           + _line("interconnect", "passed", {"healthy_cards": "all"}))
    nodes = _Nodes({"gpu-a": gpu_proof(2), "gpu-b": out})
    assert start_volume_cluster(nodes_through(nodes), handle, copies) is not None
    [command] = nodes.started("gpu-b")
    assert healthy_cards({"device": device, "compute": {"healthy_cards": [True, 2]}}) == [0, 2]
    assert " CUDA_VISIBLE_DEVICES=0,2 " in command and "--num-gpus 2 " in command
    proof = json.loads(handle.spec_path.read_text())["volume"]["nodes"][1]
    assert proof["cards"] == [0, 2] and proof["excluded"] == [
        {"card": 1, "stage": "device", "reason": "left out by the device stage"}]


def test_a_faulty_card_is_left_out_and_told_to_the_user(tmp_path: Path) -> None:
    handle, copies = _handle(tmp_path)
    wrong = "bfloat16 matmul differs from the CPU reference: max relative error 0.5"
    nodes = _Nodes({"gpu-a": gpu_proof(2), "gpu-b": gpu_proof(3, wrong={1: wrong})})
    assert start_volume_cluster(nodes_through(nodes), handle, copies) is not None
    [command] = nodes.started("gpu-b")
    assert " CUDA_VISIBLE_DEVICES=0,2 " in command and "--num-gpus 2 " in command
    spec = json.loads(handle.spec_path.read_text())
    proof = spec["volume"]["nodes"][1]
    assert proof["cards"] == [0, 2]
    assert proof["excluded"] == [{"card": 1, "stage": "compute", "reason": wrong}]
    # the driver tells it when it starts; the thread and the terminal show it
    told: list[Event] = []
    ctx = StageContext(spec=None, run_dir=str(tmp_path),  # type: ignore[arg-type]
                       emit=lambda t, **d: told.append(Event(len(told) + 1, t, "r-1",
                                                             "2026-12-03T12:00:00Z", d)))
    report_node_proofs(ctx, spec["volume"]["nodes"])
    assert [(e.type, e.data["node"], e.data["cards"], e.data["stage"]) for e in told] == [
        ("volume.card_excluded", "gpu-b:22", ["1"], "compute")]
    message = volume_message(run_of(id="r-1", name="corpus"), told)
    assert message is not None
    assert f"card 1 of node gpu-b:22 excluded by its compute stage: {wrong}" in to_text(message)


def test_a_gpu_node_whose_stages_judge_no_card_offers_every_card_it_sees(
        tmp_path: Path) -> None:
    handle, copies = _handle(tmp_path)  # blender's Cycles devices: no healthy_cards
    cycles = _line("device", "passed", {"device": "optix", "count": 2})
    nodes = _Nodes({"gpu-a": gpu_proof(2), "gpu-b": cycles})
    assert start_volume_cluster(nodes_through(nodes), handle, copies) is not None
    [command] = nodes.started("gpu-b")
    assert "CUDA_VISIBLE_DEVICES" not in command and "--num-gpus" not in command
    proof = json.loads(handle.spec_path.read_text())["volume"]["nodes"][1]
    assert (proof["device"], proof["cards"]) == ("optix", None)


@pytest.mark.parametrize("proof, why", [
    (gpu_proof(2, faulty={0: ECC, 1: ECC}),
     rf"no healthy card: card 0 \(device\): {ECC}; card 1 \(device\): {ECC}"),
    (_line("torch", "passed", {}) + _line("device", "failed", {"driver": {}}, {
        "type": "NoDevice", "message": "torch sees no GPU"}),
     "the card proof failed at the device stage: NoDevice: torch sees no GPU"),
])
def test_a_node_without_a_healthy_card_refuses_before_any_ray_starts(
        tmp_path: Path, proof: str, why: str) -> None:
    handle, copies = _handle(tmp_path)
    nodes = _Nodes({"gpu-a": gpu_proof(2), "gpu-b": proof})
    with pytest.raises(DispatchError, match=r"volume.nodes\[1\] \(gpu-b:22, python python3\): "
                                            + why.replace("(s)", r"\(s\)")):
        start_volume_cluster(nodes_through(nodes), handle, copies)
    assert [k for k, _, _ in nodes.ran] == ["proof", "proof"]  # no version probe, no start
    assert not (tmp_path / CLUSTER_FILE).exists()


def test_a_node_that_cannot_be_reached_during_its_proof_is_named(tmp_path: Path) -> None:
    handle, copies = _handle(tmp_path)

    class _Gone(_Nodes):
        def run(self, node: Any, command: str, stdin: str = "",
                timeout: float = 120) -> tuple[int, str, str]:
            if node.host == "gpu-b":
                raise NodeUnreachable("gpu-b:22: cannot connect: connection refused")
            return super().run(node, command, stdin, timeout)

    nodes = _Gone({"gpu-a": gpu_proof(2)})
    with pytest.raises(NodeUnreachable, match=r"volume.nodes\[1\] \(gpu-b:22\): the card proof "
                                              r"did not finish: gpu-b:22: cannot connect"):
        start_volume_cluster(nodes_through(nodes), handle, copies)
    assert "start" not in [k for k, _, _ in nodes.ran]


def test_the_runner_runs_only_the_stages_asked_for(tmp_path: Path) -> None:
    spec, _ids = make_volume(tmp_path, 3)
    run_dir = tmp_path / "probe"
    done = subprocess.run([sys.executable, "-m", "runner", str(spec), "--run-dir",
                           str(run_dir), "--stages", "interpreter,prepare"], cwd=REPO,
                          env=runner_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    stages = [e.data["stage"] for e in events(run_dir) if e.type == "stage.passed"]
    assert stages == ["prepare", "interpreter"]  # the table's order
    bad = subprocess.run([sys.executable, "-m", "runner", str(spec), "--run-dir",
                          str(tmp_path / "other"), "--stages", "device,nope"], cwd=REPO,
                         env=runner_env(), capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "--stages: unknown stage 'nope'" in bad.stderr
