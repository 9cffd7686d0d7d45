"""The Slack user groups a person is in, for the policy's roles (``usergroups.users.list``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

log = logging.getLogger(__name__)


class SlackDirectory:
    """``directory(user)``: the groups among ``groups()`` that ``user`` belongs to.

    Each group's members are cached for ``ttl`` seconds. A lookup Slack refuses counts as
    no members (fail closed: a role given through a group is then not granted), logged.
    """

    def __init__(self, client: WebClient, groups: Callable[[], Iterable[str]], *,
                 ttl: float = 60.0) -> None:
        self.client = client
        self.groups = groups
        self.ttl = ttl
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def __call__(self, user: str) -> frozenset[str]:
        return frozenset(g for g in self.groups() if user in self._members(g))

    def _members(self, group: str) -> frozenset[str]:
        now = time.monotonic()
        with self._lock:
            cached = self._cache.get(group)
        if cached is not None and now - cached[0] < self.ttl:
            return cached[1]
        try:
            resp = self.client.usergroups_users_list(usergroup=group)
            members = frozenset(str(u) for u in resp.get("users") or [])
        except (SlackApiError, SlackClientError) as exc:
            log.warning("cannot list the members of user group %s (usergroups:read?): %s",
                        group, exc)
            members = frozenset()
        with self._lock:
            self._cache[group] = (now, members)
        return members
