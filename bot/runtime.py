"""Wiring: the service as a transport uses it, and the commands other modules add."""

from __future__ import annotations

import importlib
from typing import Any

import typer

from bot.dispatch import Dispatcher, LocalDispatcher
from bot.manifest import LoadedManifest
from bot.message import Notifier
from bot.service import PilotService
from bot.settings import Settings
from bot.store import Store

# Modules that add commands to `preflight`; each has register(app).
COMMAND_MODULES = ("bot.cli_manifest", "bot.cli_evidence", "bot.cli_remote", "bot.slack.cli")


def make_dispatchers(settings: Settings) -> dict[str, Dispatcher]:
    dispatchers: dict[str, Dispatcher] = {
        "local": LocalDispatcher(settings.python, env=dict(settings.runner_env))}
    try:
        ssh = importlib.import_module("bot.dispatch_ssh")
    except ModuleNotFoundError as exc:
        if exc.name != "bot.dispatch_ssh":
            raise
    else:
        dispatchers["ssh"] = ssh.SSHDispatcher(
            known_hosts=settings.ssh_known_hosts, client_keys=list(settings.ssh_client_keys) or None,
            ssh_config=settings.ssh_config)
    return dispatchers


def make_service(settings: Settings, notifier: Notifier) -> PilotService:
    store = Store(settings.db_path)
    guard = None
    try:
        leases = importlib.import_module("bot.leases")
    except ModuleNotFoundError as exc:
        if exc.name != "bot.leases":
            raise
    else:
        guard = leases.lease_guard_for(store)
    return PilotService(settings, store, make_dispatchers(settings), notifier, lease_guard=guard)


def precheck(loaded: LoadedManifest) -> None:
    """The manifest and project checks that stop a run before dispatch."""
    try:
        check = importlib.import_module("bot.project_check")
    except ModuleNotFoundError as exc:
        if exc.name != "bot.project_check":
            raise
        return
    check.precheck_manifest(loaded)


def register_commands(app: typer.Typer) -> None:
    for name in COMMAND_MODULES:
        try:
            module: Any = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name != name:
                raise
            continue
        module.register(app)
