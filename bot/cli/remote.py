"""`preflight lease ...` and `preflight watch`: rented nodes from the terminal."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Optional

import typer
from rich.markup import escape
from rich.table import Column, Table

from bot.cli.common import build_service, console, fail_on
from bot.errors import PreflightError
from bot.pilot import leases as lease_rules
from bot.service import PilotService
from bot.settings import Settings


def register(app: typer.Typer) -> None:
    lease_app = typer.Typer(no_args_is_help=True, help="Leases of rented nodes: "
                            + " -> ".join(lease_rules.STATES))
    lease_app.command("list")(lease_list)
    lease_app.command("show")(lease_show)
    lease_app.command("set")(lease_set)
    app.add_typer(lease_app, name="lease")
    app.command("watch")(watch)


@contextmanager
def _service() -> Iterator[PilotService]:
    """The service on the state directory (leases go through it), closed afterwards."""
    from bot.messages.model import NullNotifier

    service = build_service(Settings.from_env(), NullNotifier(), create=True)
    try:
        yield service
    finally:
        service.close()


def lease_list() -> None:
    """The current lease of every node."""
    try:
        with _service() as service:
            rows = service.records.leases()
    except PreflightError as exc:
        raise fail_on(exc) from exc
    # the node is what a user types back (`lease set NODE ...`): never cut; the rest folds
    table = Table("state", "starts at", "days", "ends at", "updated")
    table.columns.insert(0, Column("node", no_wrap=True,
                                   min_width=max((len(r["node"]) for r in rows), default=4)))
    for column in table.columns[1:]:
        column.overflow = "fold"
    for row in rows:
        end = lease_rules.lease_end(row)
        table.add_row(row["node"], row["state"], row["starts_at"] or "-", str(row["days"] or "-"),
                      end.isoformat() if end else "-", row["updated_at"])
    empty = "no lease recorded (`preflight lease set NODE ordered --by you`)"
    console.print(table if rows else empty)


NODE_HELP = "the node: HOST, or HOST:PORT when its SSH port is not 22"


def lease_show(node: str = typer.Argument(..., help=NODE_HELP)) -> None:
    """A node's current lease and every change, with who and when."""
    try:
        node = lease_rules.normalize_node(node)
        with _service() as service:
            lease = service.records.lease_of(node)
            if lease is None:
                raise PreflightError(f"no lease recorded for {node}")
            changes = service.records.lease_changes(int(lease["id"]))
    except PreflightError as exc:
        raise fail_on(exc) from exc
    end = lease_rules.lease_end(lease)
    console.print(f"[bold]{escape(node)}[/bold]: {lease['state']}  "
                  f"(starts {lease['starts_at'] or '?'}, {lease['days'] or '?'} days, "
                  f"ends {end.isoformat() if end else '?'})",
                  highlight=False)
    table = Table("at", "from", "to", "by", "note")
    for change in changes:
        table.add_row(change["at"], change["from_state"] or "-", change["to_state"], change["by"],
                      change["note"] or "")
    console.print(table)


def lease_set(
    node: str = typer.Argument(..., help=NODE_HELP),
    state: str = typer.Argument(..., help=" | ".join(lease_rules.STATES)),
    by: str = typer.Option(..., "--by", help="who records this change"),
    starts_at: Optional[str] = typer.Option(None, help="lease start, ISO-8601 with a timezone"),
    days: Optional[int] = typer.Option(None, help="lease duration in days "
                                       "(the offers are 3, 7 or 30)"),
    note: Optional[str] = typer.Option(None, help="free text kept with the change"),
) -> None:
    """Record a lease state change (one step at a time; `ended` from any state)."""
    try:
        with _service() as service:
            lease = service.records.change_lease(node, state, by, origin="cli", note=note,
                                         starts_at=starts_at, days=days)
    except PreflightError as exc:
        raise fail_on(exc) from exc
    console.print(f"{escape(lease['node'])}: lease is now [bold]{lease['state']}[/bold] "
                  f"(recorded by {escape(by)})", highlight=False)


def watch(once: bool = typer.Option(False, help="run each job once now and exit")) -> None:
    """Run the scheduled jobs (run watch, lease and evidence reminders, the state database's
    retention) in the foreground."""
    from bot import schedule
    from bot.console.notifier import ConsoleNotifier

    settings = Settings.from_env()
    try:
        service = build_service(settings, ConsoleNotifier(console, panels_at_end=False),
                                create=True)
    except PreflightError as exc:
        raise fail_on(exc) from exc
    try:
        if once:
            now = schedule.utcnow()
            sent = (service.watch.watch_runs(now) + service.watch.check_leases(now)
                    + service.watch.remind_evidence(now))
            console.print(f"{len(sent)} alert(s) or reminder(s) sent")
            pruned = schedule.prune_store(service, now)
            if pruned:
                console.print(f"retention: pruned the item rows of {pruned} run(s) "
                              "(`preflight store` shows what the state database holds)")
            return
        _watch_forever(settings, service)
    except PreflightError as exc:
        raise fail_on(exc) from exc
    finally:
        close_dispatchers(service)


def _watch_forever(settings: Settings, service: PilotService) -> None:
    from bot import schedule

    scheduler = schedule.BotScheduler(settings, service)
    scheduler.start()
    console.print(f"watching (job store {settings.jobs_db_path}); Ctrl-C to stop")
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        scheduler.shutdown()


def close_dispatchers(service: PilotService) -> None:
    """Close the dispatchers that hold connections (the SSH one: its sessions and loop)."""
    service.close()
