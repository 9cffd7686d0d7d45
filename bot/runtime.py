"""Wiring: the service as a transport uses it, and the commands other modules add."""

from __future__ import annotations

from collections.abc import Callable

import typer

from bot import cli_evidence, cli_manifest, cli_remote, leases
from bot.dispatch import Dispatcher, LocalDispatcher
from bot.dispatch_ssh import SSHDispatcher
from bot.manifest import LoadedManifest
from bot.message import Notifier
from bot.project_check import precheck_manifest
from bot.service import PilotService
from bot.settings import Settings
from bot.slack import cli as slack_cli
from bot.store import Store


def make_dispatchers(settings: Settings) -> dict[str, Dispatcher]:
    return {
        "local": LocalDispatcher(settings.python, env=dict(settings.runner_env)),
        "ssh": SSHDispatcher(known_hosts=settings.ssh_known_hosts,
                             client_keys=list(settings.ssh_client_keys) or None,
                             ssh_config=settings.ssh_config),
    }


def make_service(settings: Settings,
                 notifier: Notifier | Callable[[Store], Notifier]) -> PilotService:
    """The service on the settings' SQLite state; ``notifier`` may need that store."""
    store = Store(settings.db_path)
    if not hasattr(notifier, "publish"):
        notifier = notifier(store)
    return PilotService(settings, store, make_dispatchers(settings), notifier,
                        lease_guard=leases.lease_guard_for(store))


def precheck(loaded: LoadedManifest) -> None:
    """The manifest and project checks that stop a run before dispatch."""
    precheck_manifest(loaded)


def register_commands(app: typer.Typer) -> None:
    for module in (cli_manifest, cli_evidence, cli_remote, slack_cli):
        module.register(app)
