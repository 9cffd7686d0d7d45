"""`preflight`: the command line, the terminal transport's entry point.

Exit codes: 0 the pilot met its success criteria (or the command succeeded), 1 the pilot
ran but failed them (or a check failed), 2 a bad manifest or a bad invocation.
"""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any, Optional

import typer
from rich.markup import escape

from bot.cli import evidence as cli_evidence
from bot.cli import manifest as cli_manifest
from bot.cli import outputs as cli_outputs
from bot.cli import remote as cli_remote
from bot.cli import report as cli_report
from bot.cli import store as cli_store
from bot.cli.common import build_service, console, err_console
from bot.cli.common import fail as _fail
from bot.console.notifier import ConsoleNotifier
from bot.console.render import to_rich
from bot.errors import DecisionRefused, ManifestError, PreflightError
from bot.messages.model import NullNotifier
from bot.messages.views import who_may_approve
from bot.pilot.decisions import DECISIONS
from bot.pilot.record import Run
from bot.pilot.states import S
from bot.service import PilotService
from bot.settings import Settings
from bot.slack import serve as slack_serve

log = logging.getLogger("preflight")
# The terminal reads new events twice a second (it draws on its own timer). Each read is
# a transaction; reading four times a second cost the follower up to twice the CPU per
# item on the 2-core build machine (bench/follow.py), for a display a quarter second fresher.
FOLLOW_POLL_S = 0.5
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                  help="Prove a rented GPU machine on a small pilot before the full job.")


def _print_manifest_error(exc: ManifestError) -> None:
    err_console.print(f"[red]{exc.source}: the manifest is not valid "
                      f"({len(exc.problems)} problem(s))[/red]", highlight=False)
    for problem in exc.problems:
        err_console.print(f"  - {problem}", highlight=False, markup=False)


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"preflight {version('preflight')}")
        except PackageNotFoundError:
            typer.echo("preflight (version unknown: not installed as a package)")
        raise typer.Exit(0)


@app.callback()
def _main(show_version: bool = typer.Option(False, "--version", callback=_version,
                                            is_eager=True, help="print the version and exit")
          ) -> None:
    """Prove a rented GPU machine on a small pilot before the full job."""


@app.command()
def run(
    manifest: Path = typer.Argument(..., help="the pilot manifest (YAML or JSON)"),
    decide: Optional[str] = typer.Option(None, help="record a decision at the end: "
                                         + " | ".join(DECISIONS)),
    reason: Optional[str] = typer.Option(None, help="the reason for --decide (required with it)"),
    by: Optional[str] = typer.Option(None, help="who submits and decides "
                                     "(default: $PREFLIGHT_USER, else $USER)"),
    override: bool = typer.Option(False, help="approve a failed pilot, or a volume forecast to "
                                  "end after the lease, recorded as an override"),
) -> None:
    """Validate, plan, run the diagnostics and the pilot, show the balance and the verdict."""
    from bot.manifest.load import load_manifest_file

    settings = Settings.from_env()
    if decide is not None and decide not in DECISIONS:
        raise _fail(f"--decide must be one of {', '.join(DECISIONS)}, not {decide!r}", 2)
    if decide is not None and not (reason or "").strip():
        raise _fail("--decide needs --reason \"...\" (every decision is recorded with its "
                    "reason)", 2)
    user = who(by, settings)
    notifier = ConsoleNotifier(console)
    service = None
    try:
        loaded = load_manifest_file(manifest)
        service = build_service(settings, notifier, create=True)
        sub = service.submit(loaded, submitter=user)
        service.starter.start(sub.run_id)
        final = _follow(service, sub.run_id, notifier)
    except ManifestError as exc:
        _print_manifest_error(exc)
        raise typer.Exit(2) from exc
    except PreflightError as exc:
        notifier.close_live()
        if service is not None:
            service.close()
        raise _fail(str(exc), exc.exit_code) from exc
    finally:
        notifier.close_live()
    try:
        _after_run(service, service.records.record(str(final["id"])), decide, reason, user,
                   override)
    finally:
        notifier.close_live()  # what the decision published (off a terminal: held till now)
        service.close()
    raise typer.Exit(0 if final.get("outcome") == "passed" else 1)


def who(by: str | None, settings: Settings) -> str:
    """The name recorded as submitting, deciding or stopping: ``--by``, else the settings'
    user; "unknown" (no PREFLIGHT_USER, USER or LOGNAME) is recorded with a warning."""
    if by:
        return by
    if not settings.user_from:
        err_console.print(f"warning: recorded as {settings.user!r}: PREFLIGHT_USER, USER and "
                          "LOGNAME are unset; pass --by NAME or set PREFLIGHT_USER",
                          style="yellow", highlight=False, markup=False)
    return settings.user


def by_hint(by: str | None, settings: Settings) -> str:
    """Where the deciding name came from, for a refused decision taken without ``--by``."""
    if by:
        return ""
    source = f"${settings.user_from}" if settings.user_from else "the default"
    return (f" (decided as {settings.user!r}, from {source}: pass --by NAME or set "
            "PREFLIGHT_USER to decide as someone else)")


def _follow(service: PilotService, run_id: str, notifier: ConsoleNotifier) -> dict[str, Any]:
    """Follow a run; Ctrl-C stops following, never the runner (it runs detached)."""
    try:
        return dict(service.follower.follow(run_id, poll=FOLLOW_POLL_S))
    except KeyboardInterrupt:
        notifier.close_live()
        err_console.print(f"stopped following {run_id}; the run goes on: preflight follow "
                          f"{run_id} / preflight stop {run_id} --reason \"…\"",
                          highlight=False, markup=False, soft_wrap=True)
        raise typer.Exit(130) from None


def ask_decision(ask: Any, say: Any) -> str | None:
    """Ask until the answer is a decision or empty (decide later): a typo is asked again,
    never recorded as a refused decision."""
    while True:
        answer = str(ask()).strip().lower()
        if not answer or answer in DECISIONS:
            return answer or None
        say(f"{answer!r} is not a decision: type one of {', '.join(DECISIONS)}, or nothing "
            "to decide later", highlight=False, markup=False)


def _after_run(service: PilotService, run: Run, decide: str | None, reason: str | None,
               user: str, override: bool) -> None:
    if decide is None and sys.stdin.isatty():
        decide = ask_decision(lambda: typer.prompt(
            f"Decision ({' / '.join(DECISIONS)}, empty to decide later)", default="",
            show_default=False), err_console.print)
        if decide is not None:
            reason = typer.prompt("Reason")
            user = typer.prompt("Decided by", default=user)
    if decide is None:
        volume = run.manifest.volume if run.manifest is not None else None
        if run.outcome == "passed" and volume is not None:
            count = volume.inputs.expected_count
            console.print(f"Approve the volume ({count} inputs): preflight decide {run.id} "
                          f"approve --reason \"…\" --by NAME. {who_may_approve(run)}",
                          highlight=False, soft_wrap=True, markup=False)
            return
        console.print(f"Decide later: preflight decide {run.id} "
                      f"{{{'|'.join(DECISIONS)}}} --reason \"...\" --by NAME", highlight=False,
                      soft_wrap=True)
        return
    try:
        record = service.decider.decide(run.id, decide, reason or "", user, override=override,
                                source="cli")
    except DecisionRefused as exc:
        err_console.print(f"[red]decision refused (recorded):[/red] {escape(str(exc))}",
                          highlight=False, soft_wrap=True)
        return
    except PreflightError as exc:  # recorded, but what it launches did not start
        err_console.print(f"[red]error:[/red] {exc}", highlight=False)
        return
    if record.get("volume_run"):
        console.print(f"volume run {record['volume_run']} started")


@app.command()
def decide(
    run_id: str = typer.Argument(..., help="the run id (or its unique prefix)"),
    decision: str = typer.Argument(..., help=" | ".join(DECISIONS)),
    reason: str = typer.Option(..., help="why (recorded)"),
    by: Optional[str] = typer.Option(None, help="who decides "
                                     "(default: $PREFLIGHT_USER, else $USER)"),
    override: bool = typer.Option(False, help="approve a failed pilot, or a volume forecast to "
                                  "end after the lease, recorded as an override"),
    follow: bool = typer.Option(True, help="follow the volume run an approval starts"),
) -> None:
    """Record a decision after a pilot: approve, fix-env or revise."""
    settings = Settings.from_env()
    notifier = ConsoleNotifier(console)
    service = build_service(settings, notifier)
    try:
        record = service.decider.decide(run_id, decision, reason, who(by, settings),
                                        override=override)
        if record.get("volume_run") and follow:
            _follow(service, str(record["volume_run"]), notifier)
    except DecisionRefused as exc:
        raise _fail(str(exc) + by_hint(by, settings), 1) from exc
    except PreflightError as exc:
        raise _fail(str(exc), exc.exit_code) from exc
    finally:
        notifier.close_live()
        service.close()


@app.command()
def follow(run_id: str = typer.Argument(..., help="the run id (or its unique prefix)")) -> None:
    """Follow a run again (after Ctrl-C, or from another terminal) until it finishes."""
    _follow_command(run_id, resume=False)


@app.command()
def resume(run_id: str = typer.Argument(..., help="the run id (or its unique prefix)")) -> None:
    """Start the runner again on an interrupted run: finished items are not processed again."""
    _follow_command(run_id, resume=True)


def _follow_command(run_id: str, *, resume: bool) -> None:
    settings = Settings.from_env()
    notifier = ConsoleNotifier(console)
    service = build_service(settings, notifier)
    try:
        found = service.records.find_record(run_id)
        if resume:
            service.resume(found.id)
        else:
            for message in service.publisher.thread_messages(found.id):
                if message.key == "plan":
                    notifier.publish(message)
        final = _follow(service, found.id, notifier)
        if final.get("status") != S.RUNNING and "decision" not in {
                m.key for m in notifier.messages}:
            # It had already finished, or another process closed it (someone stopped it):
            # the outcome as it stands, its last status frame included, not "(running)".
            for message in service.publisher.thread_messages(final["id"])[1:]:
                notifier.publish(message)
    except PreflightError as exc:
        raise _fail(str(exc), exc.exit_code) from exc
    finally:
        notifier.close_live()
        service.close()
    raise typer.Exit(0 if final.get("outcome") == "passed" else 1)


@app.command()
def stop(run_id: str = typer.Argument(..., help="the run id (or its unique prefix)"),
         reason: str = typer.Option(..., help="why (recorded with the stop)"),
         by: Optional[str] = typer.Option(None, help="who stops it "
                                          "(default: $PREFLIGHT_USER, else $USER)")) -> None:
    """Stop a running pilot or volume: its runner and all it started; `resume` continues."""
    settings = Settings.from_env()
    service = build_service(settings, NullNotifier())
    user = who(by, settings)
    try:
        run = service.stop(run_id, by=user, reason=reason)
    except PreflightError as exc:
        raise _fail(str(exc), exc.exit_code) from exc
    finally:
        service.close()
    console.print(f"run {run['id']} is {run['status']} (by {user}: {reason}); "
                  f"finished items are kept: preflight resume {run['id']} continues",
                  highlight=False, soft_wrap=True)
    raise typer.Exit(0 if run["status"] == S.STOPPED else 1)


@app.command()
def runs(as_json: bool = typer.Option(False, "--json", help="machine-readable output"),
         limit: int = typer.Option(50, help="how many, newest first")) -> None:
    """List runs with their status and the stage reached."""
    from bot.console.runs import runs_lines

    service = build_service(Settings.from_env(), NullNotifier())
    for active in service.records.running():
        service.follower.reap(active.id)  # record what runners wrote since; close runs that died
        service.follower.ends.wait(active.id)  # a run that ended: fetched and judged now
    rows = service.records.records(limit)
    if as_json:
        from bot.pilot.track_record import score_of

        keys = ("id", "name", "attempt", "kind", "status", "outcome", "stage_reached", "created_at",
                "items_pruned_at")
        typer.echo(json.dumps([{**{k: getattr(r, k) for k in keys}, **_score(score_of(r))}
                               for r in rows], indent=2))
        return
    if not rows:
        console.print("no runs yet: `preflight run MANIFEST` starts one")
        return
    # the width now (COLUMNS first), not the one the console read when it was made
    width = shutil.get_terminal_size((console.width, 24)).columns
    for line in runs_lines(rows, width):
        console.print(line, markup=False, highlight=False, soft_wrap=True)


def _score(score: Any) -> dict[str, Any]:
    """A volume's forecast score for `preflight runs --json` (nothing for other runs)."""
    if score is None:
        return {}
    return {"forecast_error_pct": score.error_pct, "forecast_within_range": score.within,
            "forecast_scored": "partial" if score.partial else "whole",
            "forecast_calibrated": score.calibrated}


@app.command()
def show(run_id: str = typer.Argument(..., help="the run id (or its unique prefix)"),
         as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """One run: stages with facts, first error, balance, verdict, decisions."""
    service = build_service(Settings.from_env(), NullNotifier())
    try:
        found = service.records.find(run_id)["id"]
        service.follower.reap(found)  # bring a running run up to date
        service.follower.ends.wait(found)  # a run that ended: fetched and judged now
        data = service.records.show(run_id)
    except PreflightError as exc:
        raise _fail(str(exc), 2) from exc
    if as_json:
        drop = {"manifest_text"}
        typer.echo(json.dumps({k: v for k, v in data.items() if k not in drop},
                              indent=2, default=str))
        return
    # The decision (buttons or outcome) is part of the thread once the pilot has finished.
    for message in service.publisher.thread_messages(data["id"]):
        console.print(to_rich(message))


@app.command()
def diff(run_a: str = typer.Argument(..., help="the earlier run"),
         run_b: str = typer.Argument(..., help="the later run"),
         as_json: bool = typer.Option(False, "--json", help="machine-readable output")) -> None:
    """What changed between two runs: manifest fields, then environment facts."""
    from bot.pilot.attempts import diff_facts, diff_manifests, one_factor_warning

    service = build_service(Settings.from_env(), NullNotifier())
    try:
        a, b = service.records.find_record(run_a), service.records.find_record(run_b)
    except PreflightError as exc:
        raise _fail(str(exc), 2) from exc
    manifest = diff_manifests(a.manifest_json, b.manifest_json)
    facts = diff_facts(a.environment or {}, b.environment or {}, (a.id, b.id))
    warning = one_factor_warning(manifest)
    if as_json:
        typer.echo(json.dumps({"a": a.id, "b": b.id,
                               "manifest": [c.to_dict() for c in manifest],
                               "environment": [c.to_dict() for c in facts],
                               "warning": warning}, indent=2, default=str))
        return
    console.print(f"[bold]{a.id} → {b.id}[/bold]")
    console.print(f"Manifest: {len(manifest)} change(s)")
    for change in manifest:
        console.print(f"  {change}", markup=False, highlight=False)
    console.print(f"Environment facts: {len(facts)} change(s)"
                  + ("" if a.environment and b.environment
                     else " (a run without recorded facts is compared as empty)"))
    for change in facts:
        console.print(f"  {change}", markup=False, highlight=False)
    if warning:
        console.print(f"[yellow]{warning}[/yellow]", highlight=False)


for _group in (cli_manifest, cli_evidence, cli_remote, cli_report, cli_outputs, cli_store,
               slack_serve):
    _group.register(app)


def main() -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    try:
        app()
    except Exception as exc:  # unexpected: keep the traceback in the log, say it briefly
        log.exception("unexpected error")
        err_console.print(f"[red]internal error:[/red] {type(exc).__name__}: {exc} "
                          "(the traceback is above; state already recorded is kept)",
                          highlight=False)
        raise SystemExit(1) from exc
