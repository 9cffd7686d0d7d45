"""The registry of node kinds: a kind's name → its manifest model and the function that
builds its dispatcher from the bot's settings. The service is handed the dispatchers this
builds (``bot/compose.py``) and picks a run's by its node's kind.

A kind is one module (or package) under ``bot/nodes/`` plus one line of ``KINDS`` below;
a kind defined elsewhere (a test's ``container`` kind) is added with ``register``, which
also makes the manifest take its model (``bot.manifest.nodes.register_node_model``), so
the manifest's node union is never edited for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

from bot.dispatch.base import Dispatcher
from bot.manifest.nodes import (
    NODE_MODELS,
    LocalNode,
    NodeSpec,
    SSHNodeSpec,
    register_node_model,
    unregister_node_model,
)
from bot.nodes.local import KIND as LOCAL_KIND
from bot.nodes.local import LocalDispatcher
from bot.nodes.ssh import KIND as SSH_KIND
from bot.nodes.ssh.dispatcher import SSHDispatcher
from bot.nodes.ssh.fetch import FetchLimits
from bot.nodes.ssh.transfer import TransferLimits
from bot.settings import Settings

Factory = Callable[[Settings], Dispatcher]


@dataclass(frozen=True)
class NodeKind:
    """One kind: its name (``kind:`` in a manifest), the model of its node section, and
    what builds its dispatcher."""

    name: str
    model: type[NodeSpec]
    build: Factory


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


KINDS: dict[str, NodeKind] = {
    LOCAL_KIND: NodeKind(LOCAL_KIND, LocalNode, local_node),
    SSH_KIND: NodeKind(SSH_KIND, SSHNodeSpec, ssh_node),
}


def register(kind: NodeKind) -> None:
    """Add a kind: its adapter here, its model to the manifest's node union. A name
    already taken by another kind is refused."""
    if KINDS.get(kind.name, kind) != kind:
        raise ValueError(f"node kind {kind.name!r} is already registered")
    if register_node_model(kind.model) != kind.name:
        raise ValueError(f"{kind.model.__name__}.kind is not {kind.name!r}")
    KINDS[kind.name] = kind


def unregister(name: str) -> None:
    """Take a kind ``register`` added away again (its model too)."""
    if KINDS.pop(name, None) is not None and name in NODE_MODELS:
        unregister_node_model(name)


@contextmanager
def registered(kind: NodeKind) -> Iterator[NodeKind]:
    """``kind`` registered for the block only (a test's kind)."""
    register(kind)
    try:
        yield kind
    finally:
        unregister(kind.name)


def make_dispatchers(settings: Settings,
                     kinds: Mapping[str, NodeKind] | None = None) -> dict[str, Dispatcher]:
    """One dispatcher per registered kind, built from ``settings``."""
    return {name: kind.build(settings) for name, kind in (kinds or KINDS).items()}
