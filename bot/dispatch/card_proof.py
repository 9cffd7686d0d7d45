"""The card proof of each node of a several-node volume, run before its Ray starts.

The dispatcher has put the runner package, the project and the inputs into each node's own
workdir (``NodeCopy``). On every node it then runs the runner's card stages
(``PROOF_STAGES``: ``python -m runner --stages ...``, in ``<node run dir>/card-proof``),
concurrently, and reads their events back: the node offers the cards its ``device`` /
``compute`` / ``interconnect`` stages left healthy, a CPU volume's node offers CPUs only.
A card those stages judged (a fault, a slow card, a wrong result, a slow link) is excluded
and reported; any other failed stage (torch missing, no GPU, too few cards) or a GPU node
with no healthy card refuses the dispatch, naming ``volume.nodes[i]``, the host, the stage
and the error, before any Ray starts.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any

from bot.dispatch.upload import UploadPlan
from bot.errors import DispatchError
from bot.nodes.base import Node
from runner.events import RUN_FINISHED
from runner.spec import CARD_STAGES, CARD_VERDICTS, healthy_cards, stage_cards

# Not memory: it runs the user's workload, which the pilot measured; not the pilot and
# what follows it: the driver's run does those.
PROOF_STAGES = ("prepare", "interpreter", "torch", "device", "compute", "interconnect")
# CARD_VERDICTS: failures that judge cards (runner/stages/cardset.py, compute_cards.py,
# interconnect.py) leave ``healthy_cards`` in their facts, and the node goes on with those.
PROOF_DIR, PROOF_SPEC = "card-proof", "card-proof.json"


@dataclass(frozen=True)
class NodeCopy:
    """Where the dispatcher put a node's own copy of the run (all under its workdir)."""

    run_dir: str
    package_root: str
    project_dir: str

    @classmethod
    def of(cls, plan: UploadPlan) -> NodeCopy:
        return cls(plan.remote_run_dir, plan.remote_pkg_root, plan.remote_project)


def proof_files(plan: UploadPlan) -> dict[str, bytes]:
    """The proof's spec, uploaded with the node's run files: the run's spec with the node's
    own paths. Its ``hardware.node_cards`` is the node's share of the rent, which the bot
    wrote into the spec (``runner.spec.node_share``): the proof judges the count as the
    head's own ``device`` stage and the pilot's do."""
    spec = plan.rewrite_spec()
    data = json.dumps(spec, indent=2, sort_keys=True).encode()
    return {f"{plan.remote_run_dir}/{PROOF_SPEC}": data}


def proof_command(copy: NodeCopy, python: str) -> str:
    """Runs the card stages on the node, from its own copy (a fresh probe directory), its
    output thrown away, then prints the proof's events file: what comes back is the
    events the runner wrote, read through the capped reader (``Node.run``), never
    whatever the project's modules print (they come first on its path)."""
    q = shlex.quote
    probe = f"{copy.run_dir}/{PROOF_DIR}"
    stages = ",".join(PROOF_STAGES)
    return (f"cd {q(copy.project_dir)} && rm -rf {q(probe)} && {{ "
            f"PYTHONPATH={q(copy.package_root)}${{PYTHONPATH:+:$PYTHONPATH}} "
            f"PYTHONUNBUFFERED=1 {q(python)} -m runner {q(copy.run_dir + '/' + PROOF_SPEC)} "
            f"--run-dir {q(probe)} --stages {stages} >/dev/null; s=$?; "
            f"cat {q(probe + '/events.jsonl')}; exit $s; }}")


@dataclass
class NodeProof:
    """What a node proved: the cards it offers and those it excluded (card, stage, reason)."""

    index: int
    where: str
    host: str
    device: str = "cpu"
    # (): CPUs only; None: every card the node sees (a preparation whose stages judge no
    # card, e.g. blender's Cycles devices)
    cards: tuple[int, ...] | None = ()
    excluded: list[dict[str, Any]] = field(default_factory=list)
    # the ``ts`` of the proof's ``run.finished`` event: names this very proof to the head's
    # runner, which takes its passed card stages instead of running them (runner/proven.py)
    finished_at: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "where": self.where, "host": self.host,
                "device": self.device, "excluded": self.excluded,
                "cards": None if self.cards is None else list(self.cards)}


def prove_nodes(nodes: Sequence[Node], copies: Sequence[NodeCopy],
                gpus: bool, report: Callable[[dict[str, Any]], object] | None = None,
                share: int | None = None) -> list[NodeProof]:
    """Every node's proof, run at the same time; the first refusal (by node order) wins.
    ``report`` hears of each node proven as its proof comes in (``phase: proved``);
    ``share``: the cards each node is rented for, the most a proof may offer."""
    def one(i: int) -> NodeProof:
        try:
            out = nodes[i].run(proof_command(copies[i], nodes[i].python), timeout=1200)
        except DispatchError as exc:  # unreachable, or no answer in time: name the node
            raise type(exc)(f"volume.nodes[{i}] ({nodes[i].where}): the card proof did not "
                            f"finish: {exc}; nothing was started") from exc
        proof = read_proof(i, nodes[i], gpus, *out, share=share)
        if report is not None:
            report({"node": nodes[i].where, "index": i, "phase": "proved",
                    "cards": None if proof.cards is None else list(proof.cards),
                    "excluded": len(proof.excluded)})
        return proof

    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = [pool.submit(one, i) for i in range(len(nodes))]
        wait(futures)
    return [f.result() for f in futures]


def read_proof(index: int, node: Node, gpus: bool, code: int, out: str,
               err: str, *, share: int | None = None) -> NodeProof:
    """The node's proof from the runner's events (its events file), or the refusal. The
    events are the node's word: typed here (a field of the wrong type refuses the node,
    named), and the healthy cards kept are only those its device stage saw, at most
    ``share`` (more is refused)."""
    name = f"volume.nodes[{index}] ({node.where}, python {node.python})"
    try:
        return _read_proof(name, index, node, gpus, code, out, err, share)
    except (ValueError, TypeError, KeyError, AttributeError) as exc:
        raise DispatchError(f"{name}: the card proof's events cannot be read "
                            f"({type(exc).__name__}: {exc}); the node's answer is refused and "
                            "nothing was started") from exc


def _read_proof(name: str, index: int, node: Node, gpus: bool, code: int, out: str,
                err: str, share: int | None) -> NodeProof:
    stages = _stage_events(out)
    if code not in (0, 1) or not stages:
        raise DispatchError(f"{name}: the card proof did not run (exit {code}): "
                            f"{_tail(err or out)}")
    proof = NodeProof(index, node.where, node.host, finished_at=_finished_at(out))
    proof.device = str(stages.get("device", {}).get("facts", {}).get("device") or "cpu")
    tolerated = CARD_VERDICTS if proof.device != "cpu" else frozenset()
    for stage in PROOF_STAGES:
        event = stages.get(stage, {})
        error = event.get("error", {})
        if event.get("type") == "stage.failed" and error.get("type") not in tolerated:
            raise DispatchError(
                f"{name}: the card proof failed at the {stage} stage: "
                f"{error.get('type')}: {error.get('message')}"
                + (f" (hint: {error['hint']})" if error.get("hint") else "")
                + "; nothing was started")
    if gpus and proof.device != "cpu":
        proof.cards, proof.excluded = _healthy(stages)
        if proof.cards is not None and share is not None and len(proof.cards) > share:
            raise DispatchError(
                f"{name}: the card proof offers {len(proof.cards)} healthy cards, more than "
                f"the {share} rented on this node: the extra cards are not the lease's to "
                "use, so the node is refused and nothing was started (show the node only "
                "its rented cards, e.g. CUDA_VISIBLE_DEVICES)")
        if proof.cards is not None and not proof.cards:
            why = "; ".join(f"card {e['card']} ({e['stage']}): {e['reason']}"
                            for e in proof.excluded) or "the stages named none"
            raise DispatchError(f"{name}: no healthy card: {why}; nothing was started")
    return proof


def _healthy(stages: dict[str, dict[str, Any]]
             ) -> tuple[tuple[int, ...] | None, list[dict[str, Any]]]:
    """The healthy cards by the runner's one rule (``runner.spec.healthy_cards``: the
    latest card stage's list; None: no stage judged any), kept to the cards the device
    stage saw, and each card left out with the stage that left it out and its reasons."""
    by_stage = {s: stages.get(s, {}).get("facts", {}) for s in CARD_STAGES}
    cards = healthy_cards(by_stage)
    if cards is None:
        return None, []
    device = by_stage["device"]
    seen = sorted(int(k) for k in device.get("cards") or {}) or list(
        range(int(device.get("count") or 0)))
    visible = set(seen)
    cards = [c for c in cards if c in visible]  # a card never seen is no card
    left_out, excluded = set(seen) - set(cards), []
    for stage in CARD_STAGES:  # each card left out, told by the first stage that left it
        event = stages.get(stage, {})
        facts = by_stage[stage]
        healthy = stage_cards(facts)
        if healthy is None:
            continue
        for card in sorted(left_out - set(healthy)):
            rows = facts.get("cards")  # by card (device, compute); interconnect: a list
            row = (rows.get(str(card)) if isinstance(rows, dict) else None) or {}
            row = row if isinstance(row, dict) else {}
            # a volume's stage passes with its verdict kept (runner.cards.tolerate_card_verdict)
            verdict = event.get("error") or facts.get("card_verdict") or {}
            verdict = verdict if isinstance(verdict, dict) else {}
            reasons = row.get("reasons") or [verdict.get("message")
                                             or "; ".join(map(str, facts.get("warnings") or []))
                                             or f"left out by the {stage} stage"]
            excluded.append({"card": card, "stage": stage,
                             "reason": "; ".join(map(str, reasons))[:500]})
        left_out &= set(healthy)
    return tuple(cards), excluded


def head_proof(copy: NodeCopy, run_id: str, proof: NodeProof) -> dict[str, Any] | None:
    """What the head's spec names of its card proof (``volume.head_proof``), so its runner
    takes the card stages this proof passed (None: the proof did not finish, run them)."""
    if not proof.finished_at:
        return None
    return {"dir": f"{copy.run_dir}/{PROOF_DIR}", "run": run_id,
            "finished_at": proof.finished_at}


def _finished_at(out: str) -> str:
    for line in reversed(out.splitlines()):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("type") == RUN_FINISHED:
            return str(event.get("ts") or "")
    return ""


def _stage_events(out: str) -> dict[str, dict[str, Any]]:
    """The last stage event of each stage in the proof's events (other lines ignored), its
    ``facts`` and ``error`` always mappings (anything else from the node is dropped)."""
    found: dict[str, dict[str, Any]] = {}
    for line in out.splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if isinstance(event, dict) and str(event.get("type", "")).startswith("stage.") \
                and event.get("type") != "stage.started":
            found[str(event.get("stage"))] = {
                **event, **{k: event[k] if isinstance(event.get(k), dict) else {}
                            for k in ("facts", "error")}}
    return found


def _tail(text: str) -> str:
    return " | ".join(ln for ln in str(text).strip().splitlines()[-4:])[-500:]
