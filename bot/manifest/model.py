"""The manifest's pydantic models, one per section; field names are the public interface.

Every section forbids unknown keys, so a typo is an error naming the field and the line,
never a silently ignored setting. Cross-field and filesystem rules live in
``bot.manifest.rules``; reading YAML with line numbers in ``bot.manifest.source``.
"""

from __future__ import annotations

import re
import shlex
from decimal import Decimal
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    AwareDatetime,
    ConfigDict,
    Field,
    field_validator,
    model_validator,
)

from bot.manifest.nodes import LocalNode, Node
from bot.manifest.types import Int, NonEmpty, Number, Section
from runner.events import STAGES
from runner.frames import FramesError, parse_frames

API_VERSION = "preflight/v1"
SLUG = r"^[a-z0-9][a-z0-9._-]{0,62}$"
ENTRY_POINT = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
_VERSION_SPEC = re.compile(r"^\s*(==|!=|>=|<=|>|<|~=)\s*\d+(\.\d+){0,2}(\.\*)?\s*$")

Name = Annotated[str, Field(pattern=SLUG, description="lower-case slug: [a-z0-9][a-z0-9._-]{0,62}")]
EntryPoint = Annotated[str, Field(pattern=ENTRY_POINT, description='"module:function"')]
MAX_LOT_PRICE_USD = Decimal("1000000")


def _frames(value: Any) -> Any:
    try:
        parse_frames(value)
    except FramesError as exc:
        raise ValueError(str(exc)) from exc
    return value


Frames = Annotated[str | Int | list[Int | str], AfterValidator(_frames), Field(
    description='preparation blender: frames of each .blend, "1-24", "1-24x2", "1,5,9" or a '
                "list; each frame is one input id, <file>.blend#0007")]


def _version_spec(example: str) -> AfterValidator:
    """A validator of a version constraint (">=3.10", ">=3.9,<3.13"), its message showing
    ``example``: the Python and the Blender constraints differ only in that."""
    def check(value: str) -> str:
        if not all(_VERSION_SPEC.match(p) for p in value.split(",")):
            raise ValueError(f"expected a version constraint such as {example}")
        return value
    return AfterValidator(check)


PythonVersion = Annotated[str, _version_spec('">=3.10" or ">=3.9,<3.13"')]
BlenderVersion = Annotated[str, _version_spec('">=3.6" or "==4.1.*"')]


class Hardware(Section):
    gpu: NonEmpty = Field(description="catalog model, case-insensitive (H100, B200, MI300X, "
                          "cpu; H100x8 and the like: a lot is one 8-card node)")
    lots: Int = Field(ge=1, le=10, description="rented lots, 1 to 10 (node-sized offers: "
                      "one node a lot)")
    days: Literal[3, 7, 30] = Field(description="plan duration: 3, 7 or 30 days")
    lot_price_usd_per_day: Decimal = Field(
        ge=0, le=MAX_LOT_PRICE_USD, decimal_places=6, allow_inf_nan=False,
        description="price of ONE lot for one day in USD (a B200 lot covers its two cards)")
    memory_estimate_gib: Number | None = Field(
        default=None, gt=0, description="the team's estimate of the peak memory per card")


class Project(Section):
    dir: NonEmpty = Field(default=".", description="relative to the manifest file's directory")
    requirements: NonEmpty | None = Field(default=None, description="relative to project.dir")
    python: PythonVersion | None = Field(default=None,
                                         description='interpreter constraint, e.g. ">=3.10"')
    params: dict[str, Any] = Field(default_factory=dict)
    exclude: list[NonEmpty] = Field(
        default_factory=list, max_length=256,
        description="folders or files under project.dir never sent to an ssh node (a data "
                    "folder, checkpoints): paths relative to project.dir, no '..'")

    @field_validator("exclude")
    @classmethod
    def _relative(cls, value: list[str]) -> list[str]:
        for path in value:
            parts = path.replace("\\", "/").split("/")
            if path.startswith(("/", "~")) or ".." in parts or re.match(r"^[A-Za-z]:", path):
                raise ValueError(f"{path!r}: a path relative to project.dir, without '..'")
        return value


class Inputs(Section):
    dir: NonEmpty = Field(description="relative to project.dir")
    pattern: NonEmpty = "*"
    expected_count: Int = Field(ge=1)
    expected_refusals: list[NonEmpty] = Field(default_factory=list)
    frames: Frames | None = None


class Task(Section):
    kind: Literal["classify", "train", "custom"] = "classify"
    handler: EntryPoint | None = None
    command: list[NonEmpty] | None = Field(
        default=None, description="external program; a string is split like a shell would")
    categories: list[NonEmpty] = Field(default_factory=list)
    batch_size: Int = Field(default=8, ge=1)
    item_timeout_s: Number | None = Field(
        default=None, ge=0, description="seconds an item may take in the handler (a batch "
        "gets this per item); an item past it is refused naming the timeout; 0 turns it off; "
        "null: 300 s in the pilot, and in the volume 10 x the pilot's p90 per item (5-300 s)")
    torch_threads: Int | None = Field(
        default=None, ge=1, description="torch's intra-op threads in the pilot (null: the "
        "cores the worker owns, from its affinity mask and CPU quota)")
    params: dict[str, Any] = Field(default_factory=dict)
    steps: Int = Field(default=1, ge=1, description="training: optimizer updates in the pilot")
    resume_steps: Int = Field(default=1, ge=1, description="training: steps after the resume")
    tolerance: Number | None = Field(default=None, ge=0,
                                    description="training: allowed resume difference")
    seed: Int = Field(default=0, ge=0,
                      description="training: random seed of the pilot and its resume test")
    trainer: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*(:[A-Za-z_][A-Za-z0-9_]*)?$",
        description='training: "module" or "module:object" providing read, build and step '
                    "(null: the built-in example trainer)")
    distributed: bool = Field(default=False,
                              description="the program itself distributes over several cards")

    @field_validator("command", mode="before")
    @classmethod
    def _split_command(cls, value: Any) -> Any:
        if isinstance(value, str):
            try:
                return shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"cannot split the command like a shell would: {exc}") from exc
        return value


class Diagnostics(Section):
    extensions: list[NonEmpty] = Field(default_factory=list)
    checks: list[EntryPoint] = Field(default_factory=list)
    timeouts: dict[str, Annotated[Number, Field(gt=0)]] = Field(default_factory=dict)
    min_free_disk_gib: Number = Field(default=1.0, ge=0)
    memory_budget_gib: Number | None = Field(default=None, gt=0)
    slow_card: Literal["fail", "warn"] = Field(
        default="fail", description="a slow card or link: fail the stage, or warn and "
                                    "leave the card out of the healthy cards")

    @field_validator("timeouts")
    @classmethod
    def _known_stages(cls, value: dict[str, float]) -> dict[str, float]:
        unknown = sorted(set(value) - set(STAGES))
        if unknown:
            raise ValueError(f"unknown stage(s) {', '.join(unknown)}; "
                             f"expected one of: {', '.join(STAGES)}")
        return value


class Success(Section):
    min_accepted: Int | None = Field(default=None, ge=0)
    max_refused: Int | None = Field(default=None, ge=0)
    balance_ok: bool = True
    require_evidence: bool = False


class Results(Section):
    runs_dir: NonEmpty | None = None
    copy_to: NonEmpty | None = None
    sample_per_category: Int = Field(default=2, ge=0)
    sample_chars: Int = Field(default=160, ge=1)


class Approvals(Section):
    approvers: list[NonEmpty] = Field(default_factory=list)
    two_person: bool = False


class Lease(Section):
    starts_at: AwareDatetime | None = Field(default=None,
                                            description="ISO-8601 with a timezone")


class VolumeInputs(Section):
    dir: NonEmpty | None = Field(
        default=None,
        description="the corpus on the bot host, relative to project.dir; required unless "
                    "`on_nodes` names a corpus only the nodes hold (then it is listed on the "
                    "head node at dispatch)")
    pattern: NonEmpty = "*"
    expected_count: Int = Field(ge=1)
    expected_refusals: list[NonEmpty] = Field(default_factory=list)
    frames: Frames | None = None
    on_nodes: NonEmpty | None = Field(
        default=None,
        description="an absolute path on every volume node (its own copy, or shared storage "
                    "mounted there) holding the same files as `dir`, or, without `dir`, "
                    "the corpus itself: listed and checksummed on each node at dispatch, "
                    "used in place, never uploaded (ssh nodes)")

    @field_validator("on_nodes")
    @classmethod
    def _node_path(cls, value: str | None) -> str | None:
        if value is None:
            return value
        if not value.startswith("/"):
            raise ValueError("an absolute path on the nodes (it is not a bot-host path)")
        if any(c in value for c in "\0\n\r"):
            raise ValueError("a path without NUL or line breaks")
        if ".." in value.split("/"):
            raise ValueError("a path without '..'")
        return value.rstrip("/") or "/"


class Volume(Section):
    inputs: VolumeInputs
    nodes: list[Node] | Int | None = Field(
        default=None,
        description="the nodes of the volume, each like `node`; null: the pilot's node alone "
                    "(a count, the older form, is accepted for 1 only)")
    cards_per_worker: Int = Field(default=1, ge=1, le=16,
                                  description="cards one worker (one Ray actor) owns")
    batch_size: Int | None = Field(default=None, ge=1,
                                   description="items per batch handed to a worker "
                                               "(null: task.batch_size)")
    time_limit_s: Int | None = Field(
        default=None, ge=60,
        description="seconds the volume's driver may run (null: twice the forecast's high "
                    "estimate + 30 min, one day without a forecast; never past the lease)")
    batch_timeout_s: Int | None = Field(
        default=None, ge=1,
        description="seconds a worker may hold a batch before it is excluded and the batch "
                    "split (null: 10 × the slowest batch, the pilot's before any, >= 60 s)")
    outputs_on_nodes: bool = Field(
        default=False,
        description="files handlers write into ctx.outputs_dir stay on the node that wrote "
                    "them (<workdir>/runs/<run>/outputs/ of each node); the head keeps each "
                    "node's list of them with their SHA-256 (outputs/on_nodes/), in the "
                    "evidence. false: they are collected to the head")
    collect_max_bytes: Int | None = Field(
        default=None, ge=1 << 20,
        description="bytes of outputs one node other than the head may send it in the "
                    "collect stage; a node past it is named and the stage fails, what came "
                    "kept (null: 64 GiB)")
    in_flight: Int = Field(default=2, ge=1, le=16,
                           description="batches each worker holds at once (run one after "
                                       "another, so its cards do not wait for the driver)")
    prefetch: Int = Field(default=1, ge=0, le=4,
                          description="batches each worker reads the input files of while "
                                      "its handler computes (item.read() from memory, the "
                                      "page cache warm for open(item.path)); 0: off")
    calibrate: bool = Field(
        default=True,
        description="after a passing pilot, its node runs at least 5 batches of the "
                    "volume's batch size on a random sample of the volume's inputs (one "
                    "warm-up call per worker timed apart) and the forecast rests on them; "
                    "false: no calibration, the forecast rests on the pilot alone")


class BlenderLicense(Section):
    """One licence that must be present on the node; its value is never read."""

    name: NonEmpty | None = Field(default=None, description="a label for messages")
    env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
                            description="an environment variable that must be set")
    file: NonEmpty | None = Field(default=None, description="a file that must be readable")
    tcp: str | None = Field(default=None, pattern=r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$",
                            description='a licence server that must answer, "host:port"')

    @model_validator(mode="after")
    def _one_kind(self) -> BlenderLicense:
        given = [k for k in ("env", "file", "tcp") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError("give exactly one of env, file or tcp"
                             + (f" (found {', '.join(given)})" if given else ""))
        return self


class Blender(Section):
    """preparation: blender: what the runner checks and how it renders (docs/blender.md)."""

    executable: NonEmpty = Field(default="blender", description="name on PATH or a path")
    version: BlenderVersion | None = Field(default=None,
                                           description='version constraint, e.g. ">=3.6"')
    addons: list[Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_.]*$")]] = Field(
        default_factory=list, description="add-on modules that must enable")
    licenses: list[BlenderLicense] = Field(default_factory=list)
    cycles_device: Literal["CUDA", "OPTIX", "HIP", "ONEAPI", "METAL", "CPU"] | None = Field(
        default=None, description="force a Cycles device type (default: from backend)")
    resolution: Annotated[list[Annotated[Int, Field(ge=1, le=65536)]],
                          Field(min_length=2, max_length=2)] | None = Field(
        default=None, description="[width, height] overriding the scene's")
    samples: Int | None = Field(default=None, ge=1, description="override the scene's samples")
    frame_timeout_s: Number = Field(default=600.0, gt=0, description="per frame")
    allow_uniform_frames: bool = Field(default=False,
                                       description="a one-colour frame is not refused")
    autoexec: bool = Field(default=False,
                           description="let the .blend run its Python (drivers, handlers)")
    compute_cpu_reference: bool = Field(default=True,
                                        description="also time the benchmark on the CPU")


class Manifest(Section):
    """A pilot manifest, ``apiVersion: preflight/v1``."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=False,
                              title="Preflight pilot manifest")

    api_version: Literal["preflight/v1"] = Field(alias="apiVersion")
    name: Name
    purpose: Literal["inference", "training"] = "inference"
    hardware: Hardware
    backend: Literal["cuda", "rocm", "cpu"]
    preparation: Literal["ubuntu", "pytorch", "blender", "custom"]
    node: Node = Field(default_factory=LocalNode)
    project: Project = Field(default_factory=Project)
    inputs: Inputs
    task: Task = Field(default_factory=Task)
    diagnostics: Diagnostics = Field(default_factory=Diagnostics)
    success: Success = Field(default_factory=Success)
    results: Results = Field(default_factory=Results)
    approvals: Approvals = Field(default_factory=Approvals)
    lease: Lease = Field(default_factory=Lease)
    volume: Volume | None = None
    blender: Blender | None = None

    def to_data(self) -> dict[str, Any]:
        """JSON-able dict with the field names a user writes (Decimal and dates as strings);
        a node of a registered kind dumped with its own fields, not only NodeSpec's."""
        return self.model_dump(mode="json", by_alias=True, serialize_as_any=True)
