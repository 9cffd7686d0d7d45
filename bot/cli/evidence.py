"""`preflight verify PATH`: re-verify a copied evidence folder, without the original run;
`preflight fetch RUN`: bring an ended run's results back from its node again;
`preflight evidence show RUN|PATH ITEM`: print one output of an evidence copy (plain file
or shard member), checked against its checksum first."""

from __future__ import annotations

import json
import sys

import typer

from runner.errors import RunnerError
from runner.evidence import show_output, verify_evidence

evidence_app = typer.Typer(no_args_is_help=True,
                           help="Read an evidence copy: one output at a time.")


@evidence_app.command("show")
def show(
    copy: str = typer.Argument(..., help="a run id (or its unique prefix, or 'latest'), or "
                               "an evidence folder: a directory or an fsspec URL"),
    item: str = typer.Argument(..., help="an input id (looked up in the copy's "
                               "balance.csv) or an output's path (outputs/...)"),
) -> None:
    """Print one input's output from the evidence copy to stdout (from its shard when the
    outputs were packed), once its bytes match the copy's checksum; where it came from
    goes to stderr."""
    from pathlib import Path

    where = copy if ("://" in copy or Path(copy).is_dir()) else _copy_of_run(copy)
    try:
        said = show_output(where, item, sys.stdout.buffer)
    except RunnerError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    sys.stdout.buffer.flush()
    typer.echo(f"{said} from {where}", err=True)


def _copy_of_run(run_id: str) -> str:
    """The evidence copy the bot recorded for a run (its ``dest``), or exit 2 saying why."""
    from bot.cli.common import build_service
    from bot.errors import PreflightError
    from bot.messages.model import NullNotifier
    from bot.settings import Settings

    service = build_service(Settings.from_env(), NullNotifier())
    try:
        run = service.records.find_record(run_id)
    except PreflightError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from exc
    finally:
        service.close()
    dest = run.evidence.dest if run.evidence is not None else None
    if not dest:
        typer.echo(f"error: run {run.id} has no evidence copy on record (no results.copy_to, "
                   "or it was not brought back); name the copy's folder or URL instead",
                   err=True)
        raise typer.Exit(2)
    return dest


def register(app: typer.Typer) -> None:
    """Add the ``verify``, ``fetch`` and ``evidence`` commands to the ``preflight`` app."""
    app.add_typer(evidence_app, name="evidence")

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
        """Check every SHA256SUMS entry, every shard and every output its index lists, and
        the files needed to understand the result."""
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
            shards = f" ({report.shards} shards)" if report.shards else ""
            typer.echo(f"verified: {path}: {report.files} files{shards}, {report.bytes} "
                       "bytes, every checksum matches")
        else:
            typer.echo(f"NOT verified: {path}: {len(report.problems)} problem(s)")
            for problem in report.problems:
                typer.echo(f"  - {problem}")
        raise typer.Exit(0 if report.ok else 1)
