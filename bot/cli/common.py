"""What every command group of the CLI shares: the consoles and building the service."""

from __future__ import annotations

import typer
from rich.console import Console

from bot.compose import make_service
from bot.errors import PreflightError
from bot.messages.model import Notifier
from bot.service import PilotService
from bot.settings import Settings

console = Console()
err_console = Console(stderr=True)


def fail(message: str, code: int) -> typer.Exit:
    """Print ``message`` as an error and return the exit to raise."""
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    return typer.Exit(code)


def build_service(settings: Settings, notifier: Notifier) -> PilotService:
    """The service as the terminal uses it: SQLite state, local and SSH dispatchers."""
    try:
        return make_service(settings, notifier)
    except PreflightError as exc:  # an unusable state directory or database
        raise fail(str(exc), 2) from exc
