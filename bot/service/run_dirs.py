"""A run's own directory: a new one per attempt, never reused, and removed again when the
run cannot be recorded (nothing recorded leaves no trace)."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from bot.errors import DispatchError, PreflightError
from bot.manifest.load import LoadedManifest
from bot.pilot.clock import new_run_id
from bot.pilot.specbuild import runs_dir_for
from bot.store import Store


def new_run_dir(store: Store, loaded: LoadedManifest, kind: str,
                runs_dir: Path) -> tuple[int, str, Path]:
    """The next attempt's number, run id and its own new directory (never reused)."""
    name = loaded.manifest.name
    attempt = store.next_attempt(name, kind)
    run_id = new_run_id(name, attempt, kind)
    run_dir = runs_dir_for(loaded, runs_dir) / run_id
    try:
        run_dir.parent.mkdir(parents=True, exist_ok=True)
        run_dir.mkdir(exist_ok=False)
    except FileExistsError as exc:
        raise DispatchError(f"run directory {run_dir} already exists: "
                            "refusing to reuse it") from exc
    except OSError as exc:
        raise DispatchError(f"cannot create run directory {run_dir}: {exc}") from exc
    return attempt, run_id, run_dir


def create_run(store: Store, run_dir: Path, record: dict[str, Any]) -> None:
    """Record the run; its directory is removed when it cannot be."""
    try:
        store.create_run(record)
    except PreflightError:
        shutil.rmtree(run_dir, ignore_errors=True)  # nothing recorded: leave no trace
        raise
