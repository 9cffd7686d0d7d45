"""`preflight report RUN [--open]`: write (or rewrite) a run's report.html, print its path."""

from __future__ import annotations

import webbrowser

import typer

from bot.cli.common import build_service, fail
from bot.errors import PreflightError, RunNotFound
from bot.messages.model import NullNotifier
from bot.settings import Settings


def register(app: typer.Typer) -> None:
    """Add the ``report`` command to the ``preflight`` app."""

    @app.command("report")
    def report(
        run_id: str = typer.Argument(..., help="the run id (or its unique prefix)"),
        open_it: bool = typer.Option(False, "--open", help="open it in the default browser"),
    ) -> None:
        """Write the run's self-contained report.html (run directory and evidence copy)."""
        service = build_service(Settings.from_env(), NullNotifier())
        try:
            run = service.records.find_record(run_id)
            files = service.publisher.write_report(run.id, strict=True)
        except RunNotFound as exc:
            raise fail(str(exc), 2) from exc
        except PreflightError as exc:
            raise fail(str(exc), 1) from exc
        finally:
            service.close()
        assert files is not None
        typer.echo(str(files.html))
        if files.evidence_copy:
            typer.echo(f"also in the evidence copy: {files.evidence_copy} "
                       "(added to its SHA256SUMS)")
        elif files.note:
            typer.echo(f"evidence copy not updated: {files.note}")
        if files.picture:
            typer.echo(f"picture: {files.picture}")
        if open_it:
            webbrowser.open(files.html.resolve().as_uri())
