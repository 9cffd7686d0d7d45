"""`preflight outputs RUN [ID]`: where a run's outputs lie, or one input's output."""

from __future__ import annotations

import json
from typing import Optional

import typer

from bot.cli.common import build_service, err_console, fail_on
from bot.errors import PreflightError
from bot.messages.model import NullNotifier
from bot.service.outputs import ItemOutput, OutputsPlace
from bot.settings import Settings


def register(app: typer.Typer) -> None:
    """Add the ``outputs`` command to the ``preflight`` app."""

    @app.command("outputs")
    def outputs(
        run_id: str = typer.Argument(..., help="the run id (or its unique prefix)"),
        item_id: Optional[str] = typer.Argument(None, help="an input's id: print its output"),
    ) -> None:
        """Where the run's outputs lie; with an input's id, that input's output (its JSON
        on standard output, where it lies on standard error)."""
        service = build_service(Settings.from_env(), NullNotifier())
        try:
            if item_id is None:
                _place(service.records.outputs_place(run_id))
            else:
                _item(service.records.item_output(run_id, item_id))
        except PreflightError as exc:
            raise fail_on(exc) from exc
        finally:
            service.close()


def _place(place: OutputsPlace) -> None:
    typer.echo(f"outputs of run {place.run.id}: {place.folder}")
    typer.echo(f"  shards: {place.shards} ({_size(place.shard_bytes)}), in shards/: one JSONL "
               "file per batch, a line {\"id\", \"output\"} per input")
    typer.echo(f"  files:  {place.files} ({_size(place.file_bytes)})")
    for listing in place.on_nodes:
        typer.echo(f"  kept on a node, listed in {listing}")
    typer.echo("each input's output is named by its recorded outcome (balance.csv, column "
               "output: outputs/shards/<shard>.jsonl#<line>, or a file's path); "
               f"`preflight outputs {place.run.id} ID` prints one")


def _item(found: ItemOutput) -> None:
    if found.reference is None:
        err_console.print(f"{found.item_id}: {found.status}; {found.note}", highlight=False,
                          markup=False)
        return
    where = f"{found.file}" + (f" line {found.line}" if found.line else "")
    if not found.found:
        raise PreflightError(f"{found.item_id}: {found.status}; its output "
                             f"{found.reference} is not here: {found.note}")
    err_console.print(f"{found.item_id}: {found.status}; output {found.reference} ({where})",
                      highlight=False, markup=False, soft_wrap=True)
    if found.line is not None:
        typer.echo(json.dumps(found.output, indent=2, sort_keys=True, ensure_ascii=False))
    else:  # a file of the handler's own: its path (it may not be text)
        typer.echo(str(found.file))


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1000  # type: ignore[assignment]
    return f"{n} B"
