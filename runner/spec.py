"""The run spec: what the bot hands the runner, as one JSON file.

Part of the bot/runner contract, so standard library only. The bot builds it from a
validated manifest with every path resolved for the node that runs it; the runner trusts
its shape but reports a clear SpecError (naming the field) when a field is missing or of
the wrong type, instead of a KeyError deep inside a stage.
"""

from __future__ import annotations

import json
import random
from dataclasses import asdict, dataclass, field
from typing import Any, Dict, List, Optional

from runner.errors import RunnerError

SPEC_VERSION = 1
# Set by the dispatcher in the environment of each volume node's ``ray start`` (so every
# Ray worker of that node inherits it): that node's own copy of the run directory, whose
# spec.json has the node's own paths (project, inputs). docs/volume.md.
NODE_RUN_DIR_ENV = "PREFLIGHT_NODE_RUN_DIR"
# Set the same way: the node's address as the manifest names it (``user@host:port``), by
# which the volume's workers and messages name their node (rented images often share one
# hostname, ``ubuntu``, so a hostname does not tell two nodes apart).
NODE_WHERE_ENV = "PREFLIGHT_NODE_WHERE"


class SpecError(RunnerError, ValueError):
    """The spec file is unreadable or a field is missing or of the wrong type."""


ITEM_MARGIN = 10  # in a volume's batch, an item not the hung one may take this × the p90


def batch_clock_s(items: int, item_timeout_s: float, pilot_item_s: float = 0.0) -> float:
    """How long a volume's batch of ``items`` may run on its worker before its handler is
    interrupted (0: no clock): one item the whole item timeout, each other one
    ``ITEM_MARGIN`` × the pilot's p90 per item (``pilot_item_s``; never more than the item
    timeout, and the item timeout each without it). One hung input in a batch of 50 then
    costs about one item timeout, not 50 of them. The one rule for the worker's clock, the
    driver's batch timeout after it, and the forecast message that shows both."""
    if item_timeout_s <= 0:
        return 0.0
    other = min(item_timeout_s, ITEM_MARGIN * pilot_item_s) if pilot_item_s > 0 \
        else item_timeout_s
    return item_timeout_s + max(0, int(items) - 1) * other


def node_share(lots: int, cards_per_lot: int, nodes: int = 1) -> int:
    """The cards one node must show: the rent (``lots`` x ``cards_per_lot``) split evenly
    over the ``nodes`` it is spread on (a volume's ``volume.nodes``; 1 otherwise), at least 1.

    The one rule for every judge of a node's count: the bot writes it into each spec it
    builds (``HardwareSpec.node_cards``: the pilot's, the volume head's, each node's card
    proof), the manifest's rules size a worker against it, and the runner's ``device``
    stage judges the cards it sees against it. 10 nodes x 8 cards: 80 rented, 8 a node.
    """
    rented = max(1, int(lots)) * max(1, int(cards_per_lot))
    return max(1, rented // max(1, int(nodes)))


# The card stages in the ladder's order: ``device`` names the cards without faults,
# ``compute`` takes out the wrong and slow ones, ``interconnect`` the card in every slow
# pair; each reports ``healthy_cards`` in its facts (a failing stage keeps its facts).
CARD_STAGES = ("device", "compute", "interconnect")
# The failures that judge cards: each leaves the cards it did not blame in
# ``healthy_cards``. In a volume's run they exclude cards, never the run.
CARD_VERDICTS = frozenset({"CardFault", "SlowCard", "WrongResult", "SlowLink"})


def healthy_cards(facts: Dict[str, Any]) -> Optional[List[int]]:
    """The run's healthy cards from its stages' facts by stage name, or None when no card
    stage reported them: the latest card stage that reported a list of card indices (ints;
    a JSON ``true`` is no card). The runner's volume and the bot read them by this rule."""
    for stage in reversed(CARD_STAGES):
        cards = stage_cards(facts.get(stage))
        if cards is not None:
            return cards
    return None


def stage_cards(stage_facts: Any) -> Optional[List[int]]:
    """One card stage's ``healthy_cards`` (sorted), or None when it reported no list of
    card indices (a JSON ``true`` is no card)."""
    cards = stage_facts.get("healthy_cards") if isinstance(stage_facts, dict) else None
    if isinstance(cards, list) and all(isinstance(c, int) and not isinstance(c, bool)
                                       for c in cards):
        return sorted(cards)
    return None


@dataclass(frozen=True)
class HardwareSpec:
    """The cards rented, as the catalog knows them. ``lots`` x ``cards_per_lot`` is the
    whole rent, over every node; ``node_cards`` is this node's share of it (``node_share``),
    what its ``device`` stage expects to see (None, an older bot's spec: the whole rent)."""

    gpu: str = "cpu"
    vendor: str = "none"
    cards_per_lot: int = 1
    memory_gib: Optional[float] = None
    bf16_tflops: Optional[float] = None
    fp32_tflops: Optional[float] = None
    lots: int = 1
    bf16_floor_tflops: Optional[float] = None
    allreduce_busbw_gbps: Dict[str, float] = field(default_factory=dict)
    node_cards: Optional[int] = None
    nodes: int = 1  # the nodes the rent is spread on (for messages)

    def expected_cards(self) -> int:
        """The cards this node must show: its share of the rent."""
        if self.node_cards is not None:
            return max(1, int(self.node_cards))
        return node_share(self.lots, self.cards_per_lot, self.nodes)


@dataclass(frozen=True)
class ProjectSpec:
    dir: str = "."
    requirements: Optional[str] = None
    params: Dict[str, Any] = field(default_factory=dict)
    commit: Optional[str] = None  # the project's git commit, taken by the bot at submit
    exclude: List[str] = field(default_factory=list)  # absolute paths never sent to a node


@dataclass(frozen=True)
class InputsSpec:
    dir: str
    pattern: str = "*"
    expected_count: int = 0
    expected_refusals: List[str] = field(default_factory=list)
    frames: Optional[Any] = None  # the Blender preparation: "1-24" or a list


@dataclass(frozen=True)
class BlenderSpec:
    """``preparation: blender``: what to check and how to render (docs/blender.md)."""

    executable: str = "blender"
    version: Optional[str] = None
    addons: List[str] = field(default_factory=list)
    licenses: List[Dict[str, Any]] = field(default_factory=list)
    cycles_device: Optional[str] = None
    resolution: Optional[List[int]] = None
    samples: Optional[int] = None
    frame_timeout_s: float = 600.0
    allow_uniform_frames: bool = False
    autoexec: bool = False
    compute_cpu_reference: bool = True


@dataclass(frozen=True)
class TaskSpec:
    kind: str = "classify"
    handler: Optional[str] = None
    command: Optional[List[str]] = None
    categories: List[str] = field(default_factory=list)
    batch_size: int = 8
    params: Dict[str, Any] = field(default_factory=dict)
    trainer: Optional[str] = None
    item_timeout_s: float = 300.0
    torch_threads: Optional[int] = None  # None: the cores the worker owns (runner/threads.py)
    # A volume follows this pilot: its workers' cards each (0: CPU workers, one CPU each), so
    # the pilot measures with the threads a volume worker gets; None: no volume follows
    worker_cards: Optional[int] = None


@dataclass(frozen=True)
class DiagnosticsSpec:
    extensions: List[str] = field(default_factory=list)
    checks: List[str] = field(default_factory=list)
    timeouts: Dict[str, float] = field(default_factory=dict)
    min_free_disk_gib: float = 0.0
    memory_budget_gib: Optional[float] = None
    compute_size: int = 1024
    slow_card: str = "fail"


@dataclass(frozen=True)
class SuccessSpec:
    min_accepted: Optional[int] = None
    max_refused: Optional[int] = None
    balance_ok: bool = True
    require_evidence: bool = False


@dataclass(frozen=True)
class ResultsSpec:
    copy_to: Optional[str] = None
    sample_per_category: int = 2
    sample_chars: int = 160
    # the bytes the bot's fetch brings back of this run at most, sized by the bot for the
    # run (bot/pilot/fetch_caps.py; 0: the bot host's setting). The bot's, read by its fetch
    fetch_max_bytes: int = 0


@dataclass(frozen=True)
class TrainingSpec:
    steps: int = 1
    resume_steps: int = 1
    tolerance: Optional[float] = None
    seed: int = 0


@dataclass(frozen=True)
class VolumeSpec:
    """How the volume's driver runs the task on Ray (present only in a volume's spec).

    ``address``: the Ray cluster to join (the dispatcher started it); None starts a local
    Ray on this machine. ``workers``: 0 = one per ``cards_per_worker`` cards offered (CPU
    workers: one per core, at most 4). ``batch_size``: 0 = ``task.batch_size``.
    ``gpus``: workers ask Ray for cards. ``batch_timeout_s``: a worker that holds a batch
    longer than this is excluded and stopped, and the batch split for the others (0 = ten
    times the slowest batch, ``pilot_batch_s`` before any batch finished, at least 60 s).
    ``pilot_batch_s``: the pilot's measured seconds for one batch of the volume's size.
    ``in_flight``: batches each worker holds at once (run one after another on it, so its
    cards do not idle during the round trip to the driver). ``prefetch``: batches each
    worker reads the input files of while it runs one (0: none). ``time_limit_s``: the pilot
    stage's timeout in the volume run (the driver's whole run; 0: the stage's default).
    ``cards``: the healthy cards this node offers (local Ray only; None: all it sees).
    ``nodes``: the card proof of each node of a several-node volume, written by the
    dispatcher (``where``, ``host``, ``cards`` offered, ``excluded`` cards with ``stage``
    and ``reason``); the driver reports every excluded card when it starts.
    """

    address: Optional[str] = None
    workers: int = 0
    cards_per_worker: int = 1
    batch_size: int = 0
    gpus: bool = False
    batch_timeout_s: float = 0.0
    cards: Optional[List[int]] = None
    pilot_batch_s: float = 0.0
    in_flight: int = 2
    prefetch: int = 1  # batches each worker reads ahead (runner/readahead.py); 0: off
    time_limit_s: float = 0.0
    nodes: Optional[List[Dict[str, Any]]] = None
    outputs_on_nodes: bool = False  # handlers' files stay on their nodes, listed on the head
    # the head's card proof of this dispatch (``dir``, ``run``, ``finished_at``): its
    # passed card stages are taken, not run again (runner/proven.py)
    head_proof: Optional[Dict[str, Any]] = None
    # ``time_limit_s`` came from the forecast (not the manifest): the driver widens it from
    # the rate it measures, never past ``lease_ends_at`` (epoch seconds; 0: unknown)
    # (runner/volume_limit.py)
    limit_adapts: bool = False
    lease_ends_at: float = 0.0
    # the bytes of outputs one node may send to the head in the ``collect`` stage (0: the
    # default, runner/volume_collect.py); a node past it is named and the stage fails
    collect_max_bytes: int = 0


@dataclass(frozen=True)
class CalibrationSpec:
    """The volume's calibration, run by a pilot's ``calibrate`` stage after its items
    (present only in the spec of a pilot with a volume, ``volume.calibrate`` not false).

    A random sample (``seed``) of the volume's inputs (``dir`` and ``pattern`` as the node
    sees them) runs on a local Ray of the pilot's node, as the volume's workers run it:
    each worker loads the handler, makes one warm-up call (timed apart), then at least
    ``batches`` batches of ``batch_size`` are timed, more while under ``min_s`` seconds, at
    most ``batches_max``. Its results are recorded in a scratch ledger under
    ``calibration/`` of the run directory (the driver's recording rate), never in the run's:
    the volume runs those inputs again."""

    dir: str = ""
    pattern: str = "*"
    batch_size: int = 1
    batches: int = 5
    batches_max: int = 30
    min_s: float = 10.0
    seed: int = 0
    cards_per_worker: int = 1
    gpus: bool = False
    # ``dir`` holds a random sample the bot drew (``draw_sample``, the same seed) of a
    # corpus the node does not hold (``listed`` inputs, ``listed_bytes``, on ``drawn_on``)
    # and sent with the pilot; 0: ``dir`` is the volume's own folder, listed here
    listed: int = 0
    listed_bytes: int = 0
    drawn_on: str = ""

    def sample_size(self, workers: int) -> int:
        """Inputs the calibration may use with ``workers``: a warm-up batch each, then up
        to ``batches_max`` batches, and a margin (the node may start more workers)."""
        return max(1, self.batch_size) * (max(1, self.batches_max) + max(1, workers)
                                          + SAMPLE_SPARE_BATCHES)


SAMPLE_SPARE_BATCHES = 8   # batches a calibration's sample holds beyond what it needs


def draw_sample(items: List[Any], seed: int, size: int) -> List[Any]:
    """The calibration's random sample of ``items`` (a listing, in id order): the bot
    draws it for a corpus the node lacks, the node for its own; the same seed draws the
    same inputs."""
    return random.Random(seed).sample(items, min(len(items), size))


@dataclass(frozen=True)
class RunSpec:
    run_id: str
    name: str
    inputs: InputsSpec
    purpose: str = "inference"
    backend: str = "cpu"
    python: Optional[str] = None
    hardware: HardwareSpec = field(default_factory=HardwareSpec)
    project: ProjectSpec = field(default_factory=ProjectSpec)
    task: TaskSpec = field(default_factory=TaskSpec)
    diagnostics: DiagnosticsSpec = field(default_factory=DiagnosticsSpec)
    success: SuccessSpec = field(default_factory=SuccessSpec)
    results: ResultsSpec = field(default_factory=ResultsSpec)
    training: TrainingSpec = field(default_factory=TrainingSpec)
    preparation: str = "pytorch"
    blender: BlenderSpec = field(default_factory=BlenderSpec)
    volume: Optional[VolumeSpec] = None
    calibration: Optional[CalibrationSpec] = None
    version: int = SPEC_VERSION

    def to_dict(self) -> Dict[str, Any]:
        return asdict(self)

    @property
    def collection(self) -> Optional[VolumeSpec]:
        """The volume whose workers write outputs on other nodes (a Ray cluster joined at
        ``volume.address``, the handler in Ray workers): the ``collect`` stage's section;
        None otherwise (one machine, or an external command)."""
        volume = self.volume
        return volume if volume is not None and volume.address and not self.task.command \
            else None

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2, sort_keys=True)

    @classmethod
    def from_dict(cls, raw: Dict[str, Any]) -> RunSpec:
        if not isinstance(raw, dict):
            raise SpecError("spec: expected a JSON object")
        try:
            return cls(
                run_id=_req(raw, "run_id", str),
                name=_req(raw, "name", str),
                purpose=_opt(raw, "purpose", "inference"),
                backend=_opt(raw, "backend", "cpu"),
                python=_opt(raw, "python", None),
                hardware=_sub(HardwareSpec, raw, "hardware"),
                project=_sub(ProjectSpec, raw, "project"),
                inputs=_sub(InputsSpec, raw, "inputs", required=True),
                task=_sub(TaskSpec, raw, "task"),
                diagnostics=_sub(DiagnosticsSpec, raw, "diagnostics"),
                success=_sub(SuccessSpec, raw, "success"),
                results=_sub(ResultsSpec, raw, "results"),
                training=_sub(TrainingSpec, raw, "training"),
                preparation=_opt(raw, "preparation", "pytorch"),
                blender=_sub(BlenderSpec, raw, "blender"),
                volume=_sub(VolumeSpec, raw, "volume") if raw.get("volume") is not None
                else None,
                calibration=_sub(CalibrationSpec, raw, "calibration")
                if raw.get("calibration") is not None else None,
                version=_opt(raw, "version", SPEC_VERSION),
            )
        except TypeError as exc:
            raise SpecError(f"spec: {exc}") from exc


def load_spec(path: str) -> RunSpec:
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise SpecError(f"cannot read spec {path}: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise SpecError(f"spec {path} is not JSON: line {exc.lineno}: {exc.msg}") from exc
    return RunSpec.from_dict(raw)


def _req(raw: Dict[str, Any], key: str, typ: type) -> Any:
    if key not in raw:
        raise SpecError(f"spec.{key}: missing")
    if not isinstance(raw[key], typ):
        raise SpecError(f"spec.{key}: expected {typ.__name__}, got {type(raw[key]).__name__}")
    return raw[key]


def _sub(cls: Any, raw: Dict[str, Any], key: str, required: bool = False) -> Any:
    value = raw.get(key)
    if value is None:
        if required:
            raise SpecError(f"spec.{key}: missing")
        return cls()
    if not isinstance(value, dict):
        raise SpecError(f"spec.{key}: expected an object, got {type(value).__name__}")
    fields = cls.__dataclass_fields__
    # Unknown fields are ignored so an older runner accepts a newer bot's spec.
    known = {k: v for k, v in value.items() if k in fields}
    for name, item in known.items():
        _check(f"spec.{key}.{name}", item, str(fields[name].type))
    try:
        return cls(**known)
    except TypeError as exc:
        raise SpecError(f"spec.{key}: {exc}") from exc


def _opt(raw: Dict[str, Any], key: str, default: Any) -> Any:
    """A top-level field with a default, its type checked against RunSpec's annotation."""
    if key not in raw:
        return default
    _check(f"spec.{key}", raw[key], str(RunSpec.__dataclass_fields__[key].type))
    return raw[key]


_SCALARS: Dict[str, Any] = {"str": (str,), "int": (int,), "float": (int, float),
                            "bool": (bool,), "Any": (object,)}


def _check(where: str, value: Any, annotation: str) -> None:
    """Raise SpecError naming ``where`` unless ``value`` fits ``annotation`` (a string:
    every module here uses postponed annotations)."""
    if annotation.startswith("Optional[") and annotation.endswith("]"):
        if value is None:
            return
        annotation = annotation[len("Optional["):-1]
    if not _fits(value, annotation):
        raise SpecError(f"{where}: expected {annotation}, got {type(value).__name__} "
                        f"{value!r:.60}")


def _fits(value: Any, annotation: str) -> bool:
    if annotation.startswith("List[") and annotation.endswith("]"):
        inner = annotation[len("List["):-1]
        return isinstance(value, list) and all(_fits(v, inner) for v in value)
    if annotation.startswith("Dict[") and annotation.endswith("]"):
        inner = annotation[len("Dict["):-1].split(",", 1)[1].strip()
        return isinstance(value, dict) and all(
            isinstance(k, str) and _fits(v, inner) for k, v in value.items())
    kinds = _SCALARS.get(annotation)
    if kinds is None:
        return True  # an annotation this checker does not know: trust the bot
    if annotation in ("int", "float") and isinstance(value, bool):
        return False
    return isinstance(value, kinds)
