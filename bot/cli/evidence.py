"""`preflight verify PATH`: re-verify a copied evidence folder, without the original run."""

from __future__ import annotations

import json

import typer

from runner.errors import RunnerError
from runner.evidence import verify_evidence


def register(app: typer.Typer) -> None:
    """Add the ``verify`` command to the ``preflight`` app."""

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
