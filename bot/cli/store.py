"""`preflight store` (what the state database holds) and `preflight store prune`."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Optional

import typer

from bot.cli.common import build_service, console, fail
from bot.messages.model import NullNotifier
from bot.service.retention import PruneResult, StoreUsage
from bot.settings import Settings

RUNS_SHOWN = 20

store_app = typer.Typer(help="The state database: what it holds, per table and per run, and "
                             "the retention that prunes ended runs' item rows.",
                        no_args_is_help=False)


def register(app: typer.Typer) -> None:
    """Add the ``store`` command group to the ``preflight`` app."""
    app.add_typer(store_app, name="store")


DAYS_HELP = ("days since a run ended for good; default PREFLIGHT_RETENTION_DAYS (30); "
             "0 prunes nothing")


@store_app.callback(invoke_without_command=True)
def store(ctx: typer.Context,
          older_than: Optional[float] = typer.Option(None, "--older-than", min=0,
                                                     help=DAYS_HELP),
          as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
          limit: int = typer.Option(RUNS_SHOWN, help="how many runs to list, largest first")
          ) -> None:
    """Sizes per table and per run, and what a prune would remove now."""
    if ctx.invoked_subcommand is not None:
        return
    service = build_service(Settings.from_env(), NullNotifier())
    try:
        usage = service.retention.usage(older_than_days=older_than)
    finally:
        service.close()
    if as_json:
        typer.echo(json.dumps(_usage_json(usage), indent=2, default=str))
        return
    for line in usage_lines(usage, limit):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


@store_app.command("prune")
def prune(older_than: Optional[float] = typer.Option(None, "--older-than", min=0,
                                                     help=DAYS_HELP),
          dry_run: bool = typer.Option(False, "--dry-run", help="name what would be pruned; "
                                                               "delete nothing"),
          vacuum: bool = typer.Option(False, "--vacuum", help="then give the freed pages back "
                                                             "to the file system (rewrites "
                                                             "the database)")) -> None:
    """Delete the item rows, expected ids and progress of runs ended for good longer ago
    than the retention (their run row, verdict, balance summary, decisions, events and
    files stay)."""
    settings = Settings.from_env()
    days = settings.retention_days if older_than is None else older_than
    if days <= 0:
        raise fail("--older-than 0 prunes nothing (0 keeps runs for ever)" if older_than
                   is not None else "retention is 0 days: runs are kept for ever "
                   "(PREFLIGHT_RETENTION_DAYS); give --older-than DAYS to prune anyway", 2)
    service = build_service(settings, NullNotifier())
    try:
        result = service.retention.prune(older_than_days=days, dry_run=dry_run, vacuum=vacuum)
    finally:
        service.close()
    for line in prune_lines(result):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def usage_lines(usage: StoreUsage, limit: int = RUNS_SHOWN) -> list[str]:
    out = [f"state database {usage.path}: {size(usage.file_bytes)} on disk (with its WAL)"]
    measured = all(t.bytes is not None for t in usage.tables)
    out.append(f"  {'table':<22} {'rows':>12} {'size':>10}")
    for t in usage.tables:
        if t.rows:
            out.append(f"  {t.name:<22} {t.rows:>12,} {size(t.bytes) if measured else '?':>10}")
    empty = [t.name for t in usage.tables if not t.rows]
    if empty:
        out.append(f"  ({len(empty)} empty table(s): {', '.join(sorted(empty))})")
    if not measured:
        out.append("  (this SQLite has no dbstat table: sizes not measured)")
    runs = sorted(usage.runs, key=lambda r: (-usage.run_bytes(r), r.run))
    out.append(f"runs ({len(runs)}; the {min(limit, len(runs))} largest), rows in the tables "
               "retention prunes:")
    out.append(f"  {'run':<44} {'status':<17} {'items':>10} {'expected':>10} {'progress':>8} "
               f"{'≈ size':>9}  pruned")
    for r in runs[:limit]:
        out.append(f"  {r.run:<44} {r.status:<17} {r.items:>10,} {r.expected_ids:>10,} "
                   f"{r.progress:>8,} {size(usage.run_bytes(r)):>9}  "
                   f"{(r.pruned_at or '')[:10]}")
    if usage.retention_days <= 0:
        out.append("retention: 0 days, runs are kept for ever (PREFLIGHT_RETENTION_DAYS)")
        return out
    out.append(f"retention: {usage.retention_days:g} days after a run ended for good "
               "(decided, finished, stopped, could not start)")
    if not usage.prunable:
        out.append("a prune now would remove nothing")
    else:
        out.append(f"a prune now would remove the rows of {len(usage.prunable)} run(s), "
                   f"≈ {size(usage.prunable_bytes)}: "
                   + ", ".join(r.run for r in usage.prunable[:10])
                   + (", …" if len(usage.prunable) > 10 else "")
                   + " (`preflight store prune`)")
    return out


def prune_lines(result: PruneResult) -> list[str]:
    verb = "would prune" if result.dry_run else "pruned"
    if not result.runs:
        return [f"nothing to prune: no run ended for good over {result.older_than_days:g} "
                "days ago still has item rows"]
    out = [f"{verb} {len(result.runs)} run(s) ended over {result.older_than_days:g} days "
           f"ago, ≈ {size(result.estimated_bytes)}:"]
    done = {p.run: p for p in result.pruned}
    for r in result.runs:
        p = done.get(r.run)
        items, ids, progress = (p.items, p.expected_ids, p.progress) if p else (
            r.items, r.expected_ids, r.progress)
        out.append(f"  {r.run}: {items:,} item row(s), {ids:,} expected id(s), {progress:,} "
                   "progress row(s)")
    if not result.dry_run:
        out.append("each run keeps its row, verdict, balance summary, decisions, events and "
                   "its run directory (balance.csv holds every item)"
                   + ("; the database was vacuumed" if result.vacuumed else
                      "; SQLite reuses the freed pages (--vacuum gives them back)"))
    return out


def size(n: int | None) -> str:
    if n is None:
        return "?"
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1000 or unit == "GB":
            return f"{int(value)} B" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{n} B"


def _usage_json(usage: StoreUsage) -> dict[str, object]:
    return {"path": str(usage.path), "file_bytes": usage.file_bytes,
            "tables": [asdict(t) for t in usage.tables],
            "runs": [{**asdict(r), "estimated_bytes": usage.run_bytes(r)} for r in usage.runs],
            "retention_days": usage.retention_days,
            "prunable": [r.run for r in usage.prunable],
            "prunable_bytes": usage.prunable_bytes}
