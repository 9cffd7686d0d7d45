"""From a validated manifest and its plan to the runner's spec, every path resolved."""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from bot.manifest.catalog import default_catalog
from bot.manifest.load import LoadedManifest
from bot.manifest.model import Blender, Inputs, Manifest, VolumeInputs
from bot.pilot.fetch_caps import sized_bytes
from bot.pilot.plan import Plan
from bot.pilot.volume_limits import ITEM_DEFAULT_S, VolumeLimits, volume_limits
from bot.pilot.volume_nodes import node_count
from runner.frames import CATEGORY
from runner.spec import (
    BlenderSpec,
    CalibrationSpec,
    DiagnosticsSpec,
    HardwareSpec,
    InputsSpec,
    ProjectSpec,
    ResultsSpec,
    RunSpec,
    SuccessSpec,
    TaskSpec,
    TrainingSpec,
    VolumeSpec,
    node_share,
)


def build_spec(loaded: LoadedManifest, plan: Plan, run_id: str, *,
               inputs: Inputs | VolumeInputs | None = None, kind: str = "pilot",
               forecast: Mapping[str, Any] | None = None) -> RunSpec:
    """The spec for one attempt. ``inputs`` overrides the pilot inputs (the volume run);
    ``forecast``: the pilot's (its high estimate gives the volume's time limit)."""
    m = loaded.manifest
    project_dir = loaded.project_dir
    src: Inputs | VolumeInputs = inputs if inputs is not None else m.inputs
    task = m.task
    paths = spec_paths(m, project_dir, inputs=src)
    limits = _limits(loaded, plan, forecast) if kind == "volume" else None
    return RunSpec(
        run_id=run_id,
        name=m.name,
        purpose=m.purpose,
        backend=m.backend,
        python=m.project.python,
        hardware=_hardware(plan, node_count(m)),
        project=ProjectSpec(dir=paths["project.dir"],
                            requirements=paths["project.requirements"],
                            params=dict(m.project.params),
                            exclude=paths["project.exclude"]),
        inputs=InputsSpec(dir=paths["inputs.dir"], pattern=src.pattern,
                          expected_count=src.expected_count,
                          expected_refusals=list(src.expected_refusals),
                          frames=_frames(src.frames)),
        task=_task(m, plan, limits),
        diagnostics=_diagnostics(m),
        success=SuccessSpec(min_accepted=m.success.min_accepted if kind == "pilot" else None,
                            max_refused=m.success.max_refused if kind == "pilot" else None,
                            balance_ok=m.success.balance_ok,
                            require_evidence=m.success.require_evidence),
        results=ResultsSpec(copy_to=paths["results.copy_to"],
                            sample_per_category=m.results.sample_per_category,
                            sample_chars=m.results.sample_chars,
                            fetch_max_bytes=sized_bytes(forecast) if kind == "volume" else 0),
        training=TrainingSpec(steps=task.steps, resume_steps=task.resume_steps,
                              tolerance=task.tolerance, seed=task.seed),
        preparation=m.preparation,
        blender=_blender(m.blender),
        volume=_volume(loaded, plan, limits),
        calibration=_calibration(loaded, plan, run_id) if kind == "pilot" else None,
    )


def spec_paths(m: Manifest, project_dir: Path, *,
               inputs: Inputs | VolumeInputs | None = None) -> dict[str, Any]:
    """Every path of a spec, by its field (``project.dir``, ``project.requirements``,
    ``project.exclude``, ``inputs.dir``, ``results.copy_to``), from the manifest and its
    project folder: what ``build_spec`` writes, and what a start holds a run's
    ``spec.json`` to (its record in the database says the manifest and the folder)."""
    src: Inputs | VolumeInputs = inputs if inputs is not None else m.inputs
    exclude = [str((project_dir / p).resolve()) for p in m.project.exclude]
    if inputs is None or inputs is m.inputs:
        exclude += _volume_corpus_apart(m, project_dir)
    return {"project.dir": str(project_dir),
            "project.requirements": _under(project_dir, m.project.requirements),
            "project.exclude": exclude,
            "inputs.dir": _inputs_dir(project_dir, src),
            "results.copy_to": _copy_to(project_dir, m.results.copy_to)}


def _hardware(plan: Plan, nodes: int) -> HardwareSpec:
    """The cards as the catalog knows them: count, memory and the per-card peaks; and what
    the node this spec runs on must show, its share of the rent over ``nodes`` (the same
    for the pilot's node, the volume's head and each node's card proof)."""
    model = default_catalog().get(plan.gpu)
    return HardwareSpec(  # the card the node shows (H100), not the offer (H100x8)
        gpu=model.card if model is not None else plan.gpu, vendor=plan.vendor,
        cards_per_lot=plan.cards_per_lot,
        memory_gib=plan.memory_per_card_gib,
        bf16_tflops=plan.bf16_tflops, fp32_tflops=plan.fp32_tflops, lots=plan.lots,
        bf16_floor_tflops=plan.bf16_floor_tflops,
        allreduce_busbw_gbps={str(k): v for k, v in plan.allreduce_busbw_gbps.items()},
        node_cards=node_share(plan.lots, plan.cards_per_lot, nodes), nodes=nodes)


def _task(m: Manifest, plan: Plan, limits: VolumeLimits | None) -> TaskSpec:
    """The task; its item timeout: the manifest's, else in the volume the one derived from
    the pilot (``limits``), else the pilot's default."""
    task = m.task
    item = (float(task.item_timeout_s) if task.item_timeout_s is not None
            else limits.item_timeout_s if limits is not None else ITEM_DEFAULT_S)
    command = [task.command] if isinstance(task.command, str) else task.command
    return TaskSpec(kind=task.kind, handler=task.handler, command=command,
                    categories=list(task.categories) or (
                        [CATEGORY] if m.preparation == "blender" else []),
                    batch_size=task.batch_size,
                    params=dict(task.params), trainer=task.trainer,
                    item_timeout_s=item,
                    torch_threads=task.torch_threads, worker_cards=_worker_cards(m, plan))


def _worker_cards(m: Manifest, plan: Plan) -> int | None:
    """The cards each volume worker holds (0: CPU workers), so the pilot measures with a
    worker's threads (runner/threads.py); None without a volume."""
    if m.volume is None:
        return None
    return m.volume.cards_per_worker if _gpus(m, plan) else 0


def _gpus(m: Manifest, plan: Plan) -> bool:
    """The volume's workers ask Ray for cards (else: CPU workers)."""
    return m.backend in ("cuda", "rocm") and plan.vendor != "none"


def _diagnostics(m: Manifest) -> DiagnosticsSpec:
    d = m.diagnostics
    return DiagnosticsSpec(extensions=list(d.extensions), checks=list(d.checks),
                           timeouts=dict(d.timeouts), min_free_disk_gib=d.min_free_disk_gib,
                           memory_budget_gib=d.memory_budget_gib, slow_card=d.slow_card)


def _frames(frames: str | int | list[int | str] | None) -> str | int | list[int | str] | None:
    return list(frames) if isinstance(frames, (list, tuple)) else frames


def _blender(section: Blender | None) -> BlenderSpec:
    """The spec's blender part; licences keep only their names and what to look for."""
    if section is None:
        return BlenderSpec()
    data = section.model_dump(mode="json")
    data["licenses"] = [{k: v for k, v in lic.items() if v is not None}
                        for lic in data["licenses"]]
    return BlenderSpec(**data)


def _limits(loaded: LoadedManifest, plan: Plan,
            forecast: Mapping[str, Any] | None) -> VolumeLimits | None:
    """The volume's time limit, batch timeout and item timeout (bot/pilot/volume_limits.py)."""
    return volume_limits(loaded.manifest.model_dump(mode="json"), plan.to_dict(), forecast,
                         datetime.now(timezone.utc))


def _volume(loaded: LoadedManifest, plan: Plan,
            limits: VolumeLimits | None) -> VolumeSpec | None:
    """The engine settings of a volume run: Ray workers on the healthy cards (a local Ray
    with CPU workers on the embedded default), its time limit and batch timeout."""
    volume = loaded.manifest.volume
    if volume is None or limits is None:
        return None
    return VolumeSpec(cards_per_worker=volume.cards_per_worker,
                      batch_size=volume.batch_size or 0,
                      gpus=_gpus(loaded.manifest, plan),
                      batch_timeout_s=limits.batch_timeout_s,
                      pilot_batch_s=limits.pilot_batch_s, in_flight=limits.in_flight,
                      prefetch=volume.prefetch,
                      time_limit_s=limits.time_limit_s, limit_adapts=limits.adapts,
                      lease_ends_at=limits.lease_ends_at,
                      outputs_on_nodes=volume.outputs_on_nodes,
                      collect_max_bytes=volume.collect_max_bytes or 0)


def _calibration(loaded: LoadedManifest, plan: Plan, run_id: str) -> CalibrationSpec | None:
    """The volume's calibration on the pilot's node (runner/stages/calibrate.py): a pilot
    with a volume, a ``task.handler`` (a command, a render and a training pilot are timed
    by the pilot alone) and ``volume.calibrate`` not false. The sample's seed is the run's
    id, so a run's sample can be drawn again."""
    m = loaded.manifest
    volume = m.volume
    if volume is None or not volume.calibrate or m.task.command or m.task.kind == "train" \
            or m.preparation == "blender" or not m.task.handler:
        return None
    return CalibrationSpec(dir=_inputs_dir(loaded.project_dir, volume.inputs),
                           pattern=volume.inputs.pattern,
                           batch_size=volume.batch_size or m.task.batch_size,
                           seed=zlib.crc32(run_id.encode("utf-8")),
                           cards_per_worker=volume.cards_per_worker, gpus=_gpus(m, plan))


def _volume_corpus_apart(m: Manifest, project_dir: Path) -> list[str]:
    """For a pilot: the volume's corpus folder when it lies in the project folder apart
    from the pilot's inputs (neither holds the other), so the pilot sends its own inputs
    and the code, not 100,000 files it never reads; the volume's dispatch sends them."""
    volume = m.volume
    if volume is None or volume.inputs.dir is None:
        return []
    corpus = (project_dir / str(volume.inputs.dir)).resolve()
    pilot = (project_dir / str(m.inputs.dir)).resolve()
    root = project_dir.resolve()
    if corpus == root or not corpus.is_relative_to(root) or corpus == pilot \
            or pilot.is_relative_to(corpus) or corpus.is_relative_to(pilot):
        return []
    return [str(corpus)]


def _inputs_dir(project_dir: Path, src: Inputs | VolumeInputs) -> str:
    """The folder the runner lists: under project.dir, or, for a corpus only the nodes hold
    (``volume.inputs.on_nodes`` without ``dir``), its path on the nodes (never read here)."""
    if isinstance(src, VolumeInputs) and src.dir is None:
        return str(src.on_nodes)
    return str((project_dir / str(src.dir)).resolve())


def runs_dir_for(loaded: LoadedManifest, default: Path) -> Path:
    runs_dir = loaded.manifest.results.runs_dir
    return (loaded.project_dir / runs_dir).resolve() if runs_dir else default


def _under(base: Path, rel: str | None) -> str | None:
    return str((base / rel).resolve()) if rel else None


def _copy_to(base: Path, dest: str | None) -> str | None:
    if not dest:
        return None
    if "://" in dest:
        return dest
    return str((base / dest).resolve())
