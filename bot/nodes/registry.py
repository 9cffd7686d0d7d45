"""The registry of node kinds: a kind's name → the function that builds its dispatcher
from the bot's settings. The service is handed the dispatchers this builds
(``bot/compose.py``) and picks a run's by its node's kind."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from bot.dispatch.base import Dispatcher
from bot.nodes.local import KIND as LOCAL_KIND
from bot.nodes.local import LocalDispatcher
from bot.nodes.ssh import KIND as SSH_KIND
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.nodes.ssh.fetch import FetchLimits
from bot.nodes.ssh.transfer import TransferLimits
from bot.settings import Settings

Factory = Callable[[Settings], Dispatcher]


def local_node(settings: Settings) -> Dispatcher:
    """``local``: the runner as a detached process on the bot host."""
    return LocalDispatcher(settings.python, env=dict(settings.runner_env))


def ssh_node(settings: Settings) -> Dispatcher:
    """``ssh``: a rented node over SSH, with the bot host's keys and limits."""
    return SSHDispatcher(known_hosts=settings.ssh_known_hosts,
                         client_keys=list(settings.ssh_client_keys) or None,
                         ssh_config=settings.ssh_config,
                         fetch_limits=FetchLimits(settings.fetch_max_bytes,
                                                  settings.fetch_max_file_bytes,
                                                  settings.fetch_max_files),
                         transfer_limits=TransferLimits(
                             settings.transfer_stall_s,
                             float(settings.transfer_floor_bytes_per_s)),
                         keep_out=(settings.runs_dir, settings.db_path.parent))


KINDS: Mapping[str, Factory] = {
    LOCAL_KIND: local_node,
    SSH_KIND: ssh_node,
}


def make_dispatchers(settings: Settings,
                     kinds: Mapping[str, Factory] = KINDS) -> dict[str, Dispatcher]:
    """One dispatcher per registered kind, built from ``settings``."""
    return {kind: build(settings) for kind, build in kinds.items()}
