"""A run's dispatcher (by its node's kind) and its handle: what the service and its
follower hand a dispatcher to act on the run, from its typed record."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from bot.dispatch.base import Dispatcher, RunHandle
from bot.dispatch.plan import LaunchPlan, spec_text_of
from bot.errors import DispatchError
from bot.store import Run, RunRecord


def dispatcher_for(dispatchers: Mapping[str, Dispatcher], run: RunRecord) -> Dispatcher:
    """The dispatcher of the run's node kind (DispatchError naming the kinds there are)."""
    kind = run.node_kind
    try:
        return dispatchers[kind]
    except KeyError as exc:
        raise DispatchError(f"node.kind {kind!r}: no dispatcher configured for it "
                            f"(available: {', '.join(sorted(dispatchers))})") from exc


def handle_for(run: RunRecord, *, resume: bool = False) -> RunHandle:
    return RunHandle(run_id=run.id, run_dir=run.run_dir, spec_path=Path(str(run.spec_path)),
                     project_dir=Path(str(run.project_dir)), pid=run.pid, resume=resume,
                     node=run.node)


def launch_plan(run: Run) -> LaunchPlan | None:
    """What a start hands the dispatch of the run: its manifest, taken from the one the
    store checked once (``Run.manifest``, its text as submitted), and its spec as the
    submission wrote it, read here once; None for a run whose stored manifest no longer
    validates (the dispatch then reads its run directory's)."""
    if run.manifest is None:
        return None
    spec_text, problem = spec_text_of(Path(str(run.spec_path)))
    return LaunchPlan.of(run.node, run.manifest.to_data().get("volume"), spec_text=spec_text,
                         spec_problem=problem, manifest_text=run.manifest_text or "")


def base_dir_of(run: RunRecord) -> Path:
    """The folder the run's manifest was read from (what its relative paths start at)."""
    if run.base_dir is None:
        raise DispatchError(f"run {run.id}: no manifest folder recorded (base_dir)")
    return run.base_dir
