"""`preflight validate | schema | plan | check-project`: the checks before a paid hour.

Exit codes: 0 valid, 1 problems found, 2 the file or directory cannot be read.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from bot.errors import ManifestError, ManifestUnreadable, Problem


def register(app: typer.Typer) -> None:
    """Add the manifest commands to the `preflight` app."""
    app.command("validate")(validate)
    app.command("schema")(schema)
    app.command("plan")(plan)
    app.command("check-project")(check_project)


def validate(
    file: Annotated[Path, typer.Argument(help="the manifest (YAML or JSON)")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable result")] = False,
) -> None:
    """Check a manifest: every problem with its field path, line and column."""
    loaded, warnings = _load_checked(file, as_json)
    _report(as_json, True, [], warnings, f"{file}: valid")


def _load_checked(file: Path, as_json: bool) -> tuple[Any, list[Problem]]:
    """The manifest with every check `preflight run` makes before the runner starts
    (the manifest's rules, then its machine-specific paths, escapes and secrets)."""
    from bot.errors import ProjectCheckError
    from bot.manifest.load import load_manifest_file
    from bot.manifest.project_check import precheck_manifest

    try:
        loaded = load_manifest_file(file)
        warnings = list(loaded.warnings) + precheck_manifest(loaded)
    except ManifestError as exc:
        code = 2 if isinstance(exc, ManifestUnreadable) else 1
        _report(as_json, False, exc.problems, exc.warnings, f"{exc.source}: not valid")
        raise typer.Exit(code) from exc
    except ProjectCheckError as exc:
        _report(as_json, False, exc.problems, [], f"{file}: not valid")
        raise typer.Exit(1) from exc
    return loaded, warnings


def schema() -> None:
    """Print the manifest's JSON Schema (for editors; see docs/manifest.md)."""
    from bot.manifest.load import manifest_json_schema

    typer.echo(json.dumps(manifest_json_schema(), indent=2, sort_keys=True))


def plan(
    file: Annotated[Path, typer.Argument(help="the manifest (YAML or JSON)")],
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable plan")] = False,
) -> None:
    """Print the order summary: model, days, lots, cards, preparation, total USD."""
    from bot.pilot.fetch_caps import caps_of
    from bot.pilot.plan import describe_lots, describe_price, make_plan, plural
    from bot.settings import Settings

    loaded, _ = _load_checked(file, as_json)
    try:
        result = make_plan(loaded, caps=caps_of(Settings.from_env()))
    except ManifestError as exc:
        _report(as_json, False, exc.problems, exc.warnings, f"{exc.source}: not valid")
        raise typer.Exit(1) from exc
    data = result.to_dict()
    if as_json:
        typer.echo(json.dumps(data, indent=2, ensure_ascii=False))
        return
    console = Console(highlight=False, soft_wrap=True)
    rows = [("GPU model", f"{result.gpu} ({result.vendor})"),
            ("Duration", plural(result.days, "day")),
            ("Lots", describe_lots(result.lots, result.cards_per_lot, result.total_cards)),
            ("Backend / preparation", f"{result.backend} / {result.preparation}"),
            ("Price per lot per day", describe_price(data["lot_price_usd_per_day"],
                                                     result.gpu, result.cards_per_lot)),
            ("Total", f"{data['total_usd']} USD"),
            ("Formula", result.formula)]
    if result.volume:
        rows.append(("Volume", result.volume))
    if result.fetch:
        rows.append(("Results fetch (caps)", result.fetch))
    for label, value in rows:
        console.print(f"{label + ':':<24}{value}", markup=False)
    for note in result.notes:
        console.print(f"  note: {note}", markup=False)


def check_project(
    directory: Annotated[Path, typer.Argument(help="the project directory")],
    manifest: Annotated[list[Path] | None,
                        typer.Option(help="also scan this manifest")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="machine-readable findings")] = False,
) -> None:
    """Check a project the guide's way: layout, pinned requirements, no machine paths."""
    from bot.manifest.project_check import check_project as run_check

    if not directory.is_dir():
        _report(as_json, False, [Problem("project", f"{directory} is not a directory",
                                         file=str(directory))], [], "cannot check")
        raise typer.Exit(2)
    problems = run_check(directory, manifests=list(manifest or []))
    errors = [p for p in problems if p.severity == "error"]
    warnings = [p for p in problems if p.severity != "error"]
    _report(as_json, not errors, errors, warnings,
            f"{directory}: " + ("ok" if not errors else f"{len(errors)} problem(s)"))
    if errors:
        raise typer.Exit(1)


def _report(as_json: bool, valid: bool, errors: list[Problem], warnings: list[Problem],
            headline: str) -> None:
    if as_json:
        payload: dict[str, Any] = {"valid": valid, "errors": [p.to_dict() for p in errors],
                                   "warnings": [p.to_dict() for p in warnings]}
        typer.echo(json.dumps(payload, indent=2, ensure_ascii=False))
        return
    console = Console(stderr=not valid, highlight=False, soft_wrap=True)
    console.print(headline, style="green" if valid else "red", markup=False)
    for problem in errors:
        console.print(f"  error: {_where(problem)}", markup=False)
    for problem in warnings:
        console.print(f"  warning: {_where(problem)}", markup=False)


def _where(problem: Problem) -> str:
    return f"{problem.file}: {problem}" if problem.file else str(problem)
