"""`preflight verify PATH`: re-verify a copied evidence folder, without the original run;
`preflight fetch RUN`: bring an ended run's results back from its node again."""

from __future__ import annotations

import json

import typer

from runner.errors import RunnerError
from runner.evidence import verify_evidence


def register(app: typer.Typer) -> None:
    """Add the ``verify`` and ``fetch`` commands to the ``preflight`` app."""

    @app.command("fetch")
    def fetch(run_id: str = typer.Argument(..., help="the run id (or its unique prefix)")
              ) -> None:
        """Fetch an ended run's results from its node again (after a refused or cut-off
        fetch); a run awaiting its decision is judged again on what comes back."""
        from bot.cli.common import build_service, console, fail_on
        from bot.errors import PreflightError
        from bot.messages.model import NullNotifier
        from bot.settings import Settings

        service = build_service(Settings.from_env(), NullNotifier())
        try:
            run = service.fetch(run_id)
        except PreflightError as exc:
            raise fail_on(exc) from exc
        finally:
            service.close()
        evidence = run.get("evidence") or {}
        console.print(f"run {run['id']}: results fetched; evidence "
                      f"{'verified' if evidence.get('verified') else 'NOT verified'} at "
                      f"{evidence.get('dest')}; outcome {run.get('outcome')}",
                      markup=False, highlight=False, soft_wrap=True)
        raise typer.Exit(0 if run.get("outcome") == "passed" else 1)

    @app.command("verify")
    def verify(
        path: str = typer.Argument(..., help="evidence folder: a directory or an fsspec URL"),
        as_json: bool = typer.Option(False, "--json", help="print the report as JSON"),
    ) -> None:
        """Check every SHA256SUMS entry and the files needed to understand the result."""
        from pathlib import Path

        if "://" not in path and not Path(path).is_dir():  # an unusable path: exit 2
            typer.echo(f"error: {path}: " + ("not a directory" if Path(path).exists() else
                                             "no such directory"), err=True)
            raise typer.Exit(2)
        try:
            report = verify_evidence(path)
        except RunnerError as exc:  # the runner's errors end here, as a message
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(2) from exc
        if as_json:
            typer.echo(json.dumps(report.to_dict(), indent=2, sort_keys=True))
        elif report.ok:
            typer.echo(f"verified: {path}: {report.files} files, {report.bytes} bytes, "
                       f"every checksum matches")
        else:
            typer.echo(f"NOT verified: {path}: {len(report.problems)} problem(s)")
            for problem in report.problems:
                typer.echo(f"  - {problem}")
        raise typer.Exit(0 if report.ok else 1)
