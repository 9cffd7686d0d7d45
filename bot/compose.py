"""The composition root: settings, store, dispatchers (one per node kind of ``bot.nodes``),
notifier and service, built in one place."""

from __future__ import annotations

from collections.abc import Callable

from bot.manifest.project_check import precheck_manifest
from bot.messages.model import Notifier
from bot.nodes.registry import make_dispatchers
from bot.policy import Policy, policy_for
from bot.policy.guard import Directory
from bot.service import PilotService
from bot.service.leases import lease_guard_for
from bot.settings import Settings
from bot.store import Store


def make_service(settings: Settings, notifier: Notifier | Callable[[Store], Notifier], *,
                 policy: Policy | None = None,
                 directory: Directory | None = None,
                 progress_interval: float = 0.2) -> PilotService:
    """The service on the settings' SQLite state; ``notifier`` may need that store (the
    Slack transport's keeps its message references there: it passes a factory).

    ``policy``: the bot's policy, read from ``settings`` when not given (PolicyError when
    the file is broken: nothing starts on a policy that cannot be read). ``directory``:
    the transport's user groups (Slack's), for roles that name a group.
    ``progress_interval``: how often, at most, a progress count is published (seconds).
    """
    policy = policy or policy_for(settings)
    store = Store(settings.db_path)
    if not hasattr(notifier, "publish"):
        notifier = notifier(store)
    return PilotService(settings, store, make_dispatchers(settings), notifier,
                        lease_guard=lease_guard_for(store), policy=policy,
                        precheck=precheck_manifest, directory=directory,
                        progress_interval=progress_interval)

