"""What every command group of the CLI shares: the consoles and building the service."""

from __future__ import annotations

import typer
from rich.console import Console
from rich.markup import escape

from bot.compose import make_service
from bot.errors import PreflightError
from bot.messages.model import Notifier
from bot.service import PilotService
from bot.settings import Settings

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` as an error and return the exit to raise."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    return typer.Exit(code)


def fail_on(exc: PreflightError) -> typer.Exit:
    """A PreflightError as the error line (its text shown as written, never read as
    markup) and the exit to raise with its exit code."""
    return fail(escape(str(exc)), exc.exit_code)


def build_service(settings: Settings, notifier: Notifier, *,
                  create: bool = False) -> PilotService:
    """The service as the terminal uses it: SQLite state, local and SSH dispatchers.

    Only a command that starts something (``create``) may create the state; any other says
    that it found none instead of leaving an empty ``state/`` where it stands.
    """
    if not create and not settings.state_found:
        raise fail(f"no Preflight state here: looked for state/preflight.db in "
                   f"{settings.home} and every folder above it. Run the command inside the "
                   "project whose runs you want (or set PREFLIGHT_HOME to it); "
                   "`preflight run MANIFEST` starts the first run of a new project", 2)
    try:
        # the terminal draws on a timer: fewer progress states suffice
        return make_service(settings, notifier, progress_interval=0.5)
    except PreflightError as exc:  # an unusable state directory or database
        raise fail(str(exc), 2) from exc
