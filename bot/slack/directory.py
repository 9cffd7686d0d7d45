"""The Slack user groups a person is in, for the policy's roles (``usergroups.users.list``)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable

from slack_sdk import WebClient
from slack_sdk.errors import SlackApiError, SlackClientError

log = logging.getLogger(__name__)


class SlackDirectory:
    """``directory(user, groups)``: the groups among ``groups`` (the ones the policy's
    roles name, given by the policy guard at each look) that ``user`` belongs to.

    Each group's members are cached for ``ttl`` seconds. A lookup Slack refuses counts as
    no members (fail closed: a role given through a group is then not granted), logged.
    """

    def __init__(self, client: WebClient, *, ttl: float = 60.0) -> None:
        self.client = client
        self.ttl = ttl
        self._cache: dict[str, tuple[float, frozenset[str]]] = {}
        self._lock = threading.Lock()

    def __call__(self, user: str, groups: Iterable[str]) -> frozenset[str]:
        return frozenset(g for g in groups if user in self._members(g))

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
