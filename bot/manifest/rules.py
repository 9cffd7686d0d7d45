"""The manifest's cross-field and filesystem rules (what pydantic alone cannot check).

Rules run on whatever sections validated, so a file with a bad ``hardware`` section still
gets its ``inputs`` checked: the user sees every problem at once. Each finding carries the
field path; ``Report`` turns it into a located Problem.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from bot.errors import Problem
from bot.manifest.blender_rules import check_blender
from bot.manifest.catalog import Catalog, GpuModel
from bot.manifest.model import (
    Approvals,
    Blender,
    Diagnostics,
    Hardware,
    Inputs,
    Project,
    Results,
    Success,
    Task,
    Volume,
    VolumeInputs,
)
from bot.manifest.nodes import NodeSpec
from bot.manifest.results_rules import LOC, evidence_place_problem
from bot.manifest.secrets import find_secrets
from bot.manifest.source import FieldPath, SourceMap, format_loc
from bot.manifest.volume_rules import check_node_lots, check_volume
from runner.inputs import InputsError, frames_of, list_dir, list_frames

CUDA_FIRST_EXTENSIONS = frozenset({"flash_attn", "xformers", "bitsandbytes", "apex"})


@dataclass(frozen=True)
class InputFile:
    """One pilot input: ``id`` is the file name without its final extension.

    The location stays a string (10,000 ``Path`` objects cost more than the listing itself).
    """

    id: str
    location: str

    @property
    def path(self) -> Path:
        return Path(self.location)

    @property
    def name(self) -> str:
        return os.path.basename(self.location)


@dataclass(frozen=True)
class InputListing:
    """One inputs folder as listed once, when the manifest was loaded: ``files`` are the
    files matching the pattern, ``inputs`` the inputs the balance counts (the files, or one
    per frame of each with ``frames``). The policy's file check, the ids the balance expects
    and the record the dispatch re-checks all read this listing."""

    directory: Path
    files: list[InputFile]
    inputs: list[InputFile]


@dataclass(frozen=True)
class Listings:
    """The inputs folders the rules listed: the pilot's and the volume's (None: not listed,
    because the folder is not there or its section had errors)."""

    inputs: InputListing | None = None
    volume: InputListing | None = None


@dataclass
class Parts:
    """The sections that validated; None where the section itself had errors."""

    hardware: Hardware | None = None
    backend: str | None = None
    preparation: str | None = None
    purpose: str | None = None
    node: NodeSpec | None = None
    project: Project | None = None
    inputs: Inputs | None = None
    task: Task | None = None
    diagnostics: Diagnostics | None = None
    success: Success | None = None
    approvals: Approvals | None = None
    volume: Volume | None = None
    blender: Blender | None = None
    results: Results | None = None
    gpu_name: str | None = None  # hardware.gpu as written, even when hardware has errors


@dataclass
class Report:
    source: SourceMap
    errors: list[Problem] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    def problem(self, loc: FieldPath, message: str, *, severity: str = "error") -> None:
        line, column = self.source.locate(loc)
        problem = Problem(format_loc(loc) or "(document)", message, line, column,
                          severity=severity)
        (self.errors if severity == "error" else self.warnings).append(problem)

    def warn(self, loc: FieldPath, message: str) -> None:
        self.problem(loc, message, severity="warning")


def list_inputs(directory: Path, pattern: str, frames: Any = None) -> list[InputFile]:
    """The files of ``directory`` matching ``pattern``, sorted by id; with ``frames``
    (preparation blender) one input per frame of each file, ``shot01.blend#0007``.

    The runner's own listing (``runner.inputs``), so the bot expects exactly the ids the
    runner will find: regular files directly in the directory, hidden files left out.
    Raises InputsError when the directory cannot be listed or two files share an id.
    """
    if frames is not None:
        items = list_frames(str(directory), pattern, frames)
    else:
        items = list_dir(str(directory), pattern)
    return [InputFile(item.id, item.path) for item in items]


def list_folder(directory: Path, pattern: str, frames: Any = None) -> InputListing:
    """``list_inputs`` that keeps the files as well as the inputs, from one listing of the
    folder; InputsError like ``list_inputs``."""
    files = list_dir(str(directory), pattern)
    items = frames_of(files, frames) if frames is not None else files
    return InputListing(directory, [InputFile(f.id, f.path) for f in files],
                        [InputFile(item.id, item.path) for item in items])


def check_rules(parts: Parts, data: Any, *, base_dir: Path, catalog: Catalog,
                report: Report, bot_places: Sequence[tuple[str, Path]] = ()) -> Listings:
    """Run every rule whose sections validated; findings go into ``report``. Returns the
    inputs folders as listed by the rules (each listed once). ``bot_places``: the bot's
    own folders (its runs folder, its state), which no evidence copy may touch."""
    gpu = _check_hardware(parts, catalog, report)
    _check_backend_nuances(parts, gpu, report)
    _check_task(parts, report)
    _check_node(parts, report)
    _check_approvals(parts, report)
    _check_success(parts, report)
    check_blender(parts, isinstance(data, dict) and "blender" in data, report)
    project_dir = _check_project(parts, base_dir, report)
    if project_dir is not None and parts.task is not None:
        from bot.manifest.entry_points import check_entry_points

        for loc, message in check_entry_points(parts.task, project_dir):
            report.problem(loc, message)
    _check_evidence(parts, data, report)
    if project_dir is not None:
        why = evidence_place_problem(parts.results, project_dir, bot_places)
        if why is not None:
            report.problem(LOC, why)
    listings = Listings()
    if project_dir is not None and parts.inputs is not None:
        listings = replace(listings, inputs=check_input_files(
            parts.inputs, project_dir, ("inputs",), report, required=True))
    if project_dir is not None and parts.volume is not None:
        listings = replace(listings, volume=check_input_files(
            parts.volume.inputs, project_dir, ("volume", "inputs"), report,
            required=_volume_is_local(parts)))
    check_node_lots(gpu, parts.hardware, parts.volume, report)
    if parts.volume is not None:
        check_volume(parts.volume, gpu, parts.hardware, report)
        if parts.volume.inputs.on_nodes and _volume_is_local(parts):
            report.problem(("volume", "inputs", "on_nodes"), "a corpus already on the nodes "
                           "is for a volume on ssh nodes; this one runs on this machine: "
                           "give volume.inputs.dir alone")
    for finding in find_secrets(data):
        report.problem(finding.path, finding.message)
    return listings


def _check_hardware(parts: Parts, catalog: Catalog, report: Report) -> GpuModel | None:
    if parts.gpu_name is None:
        return None
    gpu = catalog.get(parts.gpu_name)
    if gpu is None:
        report.problem(("hardware", "gpu"), f"unknown GPU model {parts.gpu_name!r}; "
                       f"expected one of: {', '.join(catalog.names())}")
        return None
    if parts.backend is not None and parts.backend not in gpu.backends:
        report.problem(("backend",), f"{gpu.key} supports {' or '.join(gpu.backends)} only; "
                       f"found {parts.backend!r}" + _backend_hint(gpu, parts.backend))
    if parts.hardware is None:
        return gpu
    estimate = parts.hardware.memory_estimate_gib
    if gpu.memory_gib is not None and estimate is not None and estimate > gpu.memory_gib:
        report.warn(("hardware", "memory_estimate_gib"),
                    f"the estimate ({estimate:g} GiB) exceeds the {gpu.memory_gib:g} GiB of one "
                    f"{gpu.key} card; several cards do not pool their memory unless the "
                    "program distributes itself")
    budget = parts.diagnostics.memory_budget_gib if parts.diagnostics else None
    if gpu.memory_gib is not None and budget is not None and budget > gpu.memory_gib:
        report.warn(("diagnostics", "memory_budget_gib"),
                    f"{budget:g} GiB is more than one {gpu.key} card holds "
                    f"({gpu.memory_gib:g} GiB)")
    return gpu


def _backend_hint(gpu: GpuModel, backend: str) -> str:
    if gpu.vendor == "amd" and backend == "cuda":
        return " (a CUDA dependency needs an NVIDIA card; on an MI300X use backend: rocm and " \
               "check ROCm builds of every extension)"
    if gpu.is_cpu:
        return " (hardware.gpu: cpu runs the pilot without an accelerator)"
    if backend == "cpu":
        return f" (a rented {gpu.key} must be proven on its card, not on the CPU)"
    return ""


def _check_backend_nuances(parts: Parts, gpu: GpuModel | None, report: Report) -> None:
    extensions = parts.diagnostics.extensions if parts.diagnostics else []
    if parts.backend == "rocm" and extensions:
        cuda_first = sorted(set(extensions) & CUDA_FIRST_EXTENSIONS)
        report.warn(("diagnostics", "extensions"),
                    "on ROCm, check that each extension has a ROCm build for this card"
                    + (f" ({', '.join(cuda_first)} started CUDA-only)" if cuda_first else "")
                    + "; an install command copied from a CUDA machine is not a "
                    "compatibility check: the extensions stage will import each one")
    if gpu is not None and gpu.note and gpu.cards_per_lot > 1 and parts.hardware is not None:
        report.warn(("hardware", "gpu"), gpu.note)
    if parts.preparation in ("ubuntu", "custom") and parts.project is not None \
            and parts.project.requirements is None:
        report.warn(("project", "requirements"),
                    f"preparation {parts.preparation!r} states a need, it does not install "
                    "torch or your project: list what must be present in a requirements file")


def _check_task(parts: Parts, report: Report) -> None:
    task = parts.task
    if task is None:
        return
    if task.handler is not None and task.command is not None:
        report.problem(("task", "command"), "give task.handler or task.command, not both")
    elif task.handler is None and task.command is None and parts.preparation != "blender" \
            and task.kind != "train":
        report.problem(("task", "handler"), 'give task.handler ("module:function") or '
                       "task.command (the program to run)")
    if task.kind == "train" and task.handler is not None:
        report.warn(("task", "handler"), "kind: train runs the trainer (task.trainer, or the "
                    "built-in example): task.handler is not used and can be left out")
    if task.kind != "train" and not task.categories and parts.preparation != "blender":
        report.problem(("task", "categories"), "list the allowed categories (at least one): "
                       "every accepted result must carry one of them")
    _check_unique(task.categories, ("task", "categories"), "category", report)
    if task.trainer is not None and task.kind != "train":
        report.warn(("task", "trainer"), "task.trainer is used only with kind: train "
                    f"(kind is {task.kind}): it is ignored")
    if parts.purpose == "training" and task.kind == "classify":
        report.warn(("task", "kind"), "purpose is training but task.kind is classify: "
                    "use kind: train for a pilot that updates and checkpoints a model")


def _check_unique(values: Sequence[str], loc: FieldPath, what: str, report: Report) -> None:
    first: dict[str, int] = {}
    for index, value in enumerate(values):
        key = value.casefold()
        if key in first:
            report.problem((*loc, index), f"{what} {value!r} repeats "
                           f"{values[first[key]]!r} ({format_loc((*loc, first[key]))}); "
                           "each must be unique, case-insensitively")
        else:
            first[key] = index


def _check_node(parts: Parts, report: Report) -> None:
    node = parts.node
    if node is None:
        return
    if node.is_remote and node.host is None:
        report.problem(("node", "host"), f"an {node.kind} node needs node.host (the "
                       "machine's address)")
    if node.is_remote and node.workdir is None:
        report.warn(("node", "workdir"), "no node.workdir: the runner will work in the login "
                    "directory; name a work directory so a change of machine is explicit")
    if not node.is_remote and node.host is not None:
        report.warn(("node", "host"), f"node.host is ignored for kind: {node.kind}")


def _check_approvals(parts: Parts, report: Report) -> None:
    approvals = parts.approvals
    if approvals is None or not approvals.two_person:
        return
    if not approvals.approvers:
        report.problem(("approvals", "approvers"), "two_person is set: list the approvers "
                       "(someone other than the submitter must approve)")
    elif len(approvals.approvers) == 1:
        report.warn(("approvals", "approvers"), "two_person with a single approver: that "
                    "person cannot approve a pilot they submitted")
    _check_unique(approvals.approvers, ("approvals", "approvers"), "approver", report)


def _check_success(parts: Parts, report: Report) -> None:
    if parts.success is None or parts.inputs is None:
        return
    expected = parts.inputs.expected_count
    refusals = len(set(parts.inputs.expected_refusals))
    can_accept = expected - refusals
    if refusals > expected:
        report.problem(("inputs", "expected_refusals"), f"{refusals} expected refusals but "
                       f"only {expected} inputs expected")
    minimum, maximum = parts.success.min_accepted, parts.success.max_refused
    if minimum is not None and minimum > can_accept:
        report.problem(("success", "min_accepted"), f"{minimum} cannot be met: {expected} "
                       f"inputs - {refusals} expected refusal(s) = {can_accept} can be accepted")
    if maximum is not None and maximum < refusals:
        report.problem(("success", "max_refused"), f"{maximum} is below the {refusals} "
                       "expected refusal(s): the pilot could never pass")
    if maximum is not None and maximum > expected:
        report.warn(("success", "max_refused"), f"{maximum} is more than the {expected} inputs")


def _check_evidence(parts: Parts, data: Any, report: Report) -> None:
    results = data.get("results") if isinstance(data, dict) else None
    copy_to = results.get("copy_to") if isinstance(results, dict) else None
    if parts.success is not None and parts.success.require_evidence and not copy_to:
        report.problem(("success", "require_evidence"), "require_evidence needs "
                       "results.copy_to: the place the evidence is copied to and verified")


def _check_project(parts: Parts, base_dir: Path, report: Report) -> Path | None:
    if parts.project is None:
        return None
    project_dir = (base_dir / parts.project.dir).resolve()
    if not project_dir.is_dir():
        report.problem(("project", "dir"), f"{project_dir} is not a directory (project.dir is "
                       "relative to the manifest's directory)")
        return None
    requirements = parts.project.requirements
    if requirements is not None and not (project_dir / requirements).is_file():
        report.problem(("project", "requirements"), f"{requirements!r} not found in "
                       f"{project_dir}")
    _check_exclude(parts, project_dir, report)
    return project_dir


def _check_exclude(parts: Parts, project_dir: Path, report: Report) -> None:
    """What ``project.exclude`` leaves out must not hold what the run reads on the node:
    the requirements file, the inputs (the volume's too, unless the nodes hold them), nor
    the project itself."""
    assert parts.project is not None
    needed: list[tuple[str, Path]] = [("project.dir", project_dir)]
    if parts.project.requirements:
        needed.append(("project.requirements", project_dir / parts.project.requirements))
    if parts.inputs is not None:
        needed.append(("inputs.dir", project_dir / parts.inputs.dir))
    volume = parts.volume.inputs if parts.volume is not None else None
    if volume is not None and volume.dir is not None and not volume.on_nodes:
        needed.append(("volume.inputs.dir", project_dir / volume.dir))
    for k, path in enumerate(parts.project.exclude):
        left_out = (project_dir / path).resolve()
        for name, what in needed:
            what = what.resolve()
            if what == left_out or left_out in what.parents:
                report.problem(("project", "exclude", k), f"{path!r} holds {name} ({what}), "
                               "which the run reads on the node: exclude a folder beside it")


def _volume_is_local(parts: Parts) -> bool:
    """The volume runs on this machine (its nodes, else the pilot's, are ``local``): its
    inputs folder is here now, so a missing one is an error, not a warning."""
    assert parts.volume is not None
    nodes = parts.volume.nodes
    if isinstance(nodes, list) and nodes:
        return not any(n.is_remote for n in nodes)
    return parts.node is not None and not parts.node.is_remote


def check_input_files(inputs: Inputs | VolumeInputs, project_dir: Path, loc: FieldPath,
                      report: Report, *, required: bool) -> InputListing | None:
    """Count, id and refusal rules for one inputs section; returns the folder as listed
    (None when it could not be listed, or it is a corpus only the nodes hold: no ``dir``)."""
    if inputs.dir is None:  # volume.inputs.on_nodes alone: the head node lists it at dispatch
        return None
    directory = (project_dir / inputs.dir).resolve()
    say: Callable[[FieldPath, str], None] = report.problem if required else report.warn
    if not directory.is_dir():
        say((*loc, "dir"), f"{directory} is not a directory (inputs.dir is relative to "
            "project.dir)" + ("" if required else "; checked again before an approval is "
                                  "recorded"))
        return None
    if "/" in inputs.pattern or "\\" in inputs.pattern:
        report.problem((*loc, "pattern"), "the pattern matches file names directly in "
                       "inputs.dir (no '/', no absolute path, no '..'): point inputs.dir at "
                       "the folder instead")
        return None
    try:
        listing = list_folder(directory, inputs.pattern, inputs.frames)
    except InputsError as exc:
        say((*loc, "frames" if str(exc).startswith("inputs.frames") else "pattern"), str(exc))
        return None
    files = listing.inputs
    if len(files) != inputs.expected_count:
        what = (f"frames ({inputs.frames!r} of each file)" if inputs.frames is not None
                else "files")
        report.problem((*loc, "expected_count"), f"expected {inputs.expected_count} input "
                       f"{what}, found {len(files)} in {directory} matching {inputs.pattern!r}")
    _check_ids(files, loc, report)
    _check_refusals(inputs.expected_refusals, {f.id for f in files}, loc, report)
    return listing


def _check_ids(files: list[InputFile], loc: FieldPath, report: Report) -> None:
    by_key: dict[str, list[InputFile]] = {}
    for f in files:
        by_key.setdefault(f.id.casefold(), []).append(f)
    for group in by_key.values():
        if len(group) > 1:
            names = ", ".join(f.name for f in group)
            report.problem((*loc, "pattern"), f"input ids collide ({names}): an id is the "
                           "file name without its extension and must be unique, "
                           "case-insensitively")


def _check_refusals(refusals: list[str], ids: set[str], loc: FieldPath,
                    report: Report) -> None:
    folded = {i.casefold(): i for i in ids}
    _check_unique(refusals, (*loc, "expected_refusals"), "expected refusal", report)
    seen: set[str] = set()
    for index, rid in enumerate(refusals):
        if rid in ids or rid.casefold() in seen:
            seen.add(rid.casefold())
            continue
        seen.add(rid.casefold())
        near = folded.get(rid.casefold()) or folded.get(Path(rid).stem.casefold())
        hint = f" (did you mean {near!r}?)" if near else ""
        report.problem((*loc, "expected_refusals", index), f"no input with id {rid!r}{hint}; "
                       "ids are file names without their extension")
