"""The policy file's pydantic models: who may do what, and what a Slack manifest may touch.

The file belongs to whoever runs the bot; a manifest posted in Slack is untrusted input
and can only narrow what the policy allows. Every section forbids unknown keys, so a typo
is an error naming the key and its line, never a setting silently ignored.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator, model_validator

from bot.errors import LeaseError
from bot.pilot.leases import split_key

Origin = Literal["slack", "cli"]
SLACK_ID = r"^[UWS][A-Z0-9]{2,30}$"
SlackId = Annotated[str, Field(pattern=SLACK_ID, description="a Slack user id (U…, W…) or "
                                                              "user group id (S…)")]
ChannelId = Annotated[str, Field(pattern=r"^[CG][A-Z0-9]{2,30}$",
                                 description="a Slack channel id (C…, G…)")]
GroupId = Annotated[str, Field(pattern=r"^S[A-Z0-9]{2,30}$",
                               description="a Slack user group id (S…)")]
FINGERPRINT = r"^SHA256:[A-Za-z0-9+/]{43}=?$"
Int = Annotated[int, Strict()]


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Roles(Section):
    submitters: list[SlackId] | None = Field(
        default=None, description="who may submit from Slack; null: anyone in a served channel")
    approvers: list[SlackId] = Field(default_factory=list,
                                     description="who may approve; a manifest only narrows it")
    lease_operators: list[SlackId] = Field(default_factory=list,
                                           description="who may move a lease from Slack")
    admins: list[SlackId] = Field(default_factory=list,
                                  description="every role, and approvals above the caps")


class TaskCommand(Section):
    local: bool = Field(default=False, description="task.command from Slack on the bot host")
    ssh: bool = Field(default=True,
                      description="task.command from Slack on an SSH node listed in nodes")


class Approvals(Section):
    two_person: bool = Field(default=False,
                             description="force the two-person rule on every pilot")


class Spending(Section):
    max_lots: Int | None = Field(default=None, ge=1)
    max_days: Int | None = Field(default=None, ge=1)
    max_total_usd: Decimal | None = Field(default=None, ge=0, allow_inf_nan=False)


class TeamRoots(Section):
    """The project roots of one team: what a Slack manifest from its channels (or from a
    member of its user groups) may name, instead of ``project_roots``."""

    channels: list[ChannelId] = Field(default_factory=list,
                                      description="channels whose manifests use these roots")
    groups: list[GroupId] = Field(default_factory=list,
                                  description="user groups whose members' manifests use them")
    roots: list[str] = Field(min_length=1, description="absolute directories on the bot host")
    shared: bool = Field(default=False,
                         description="also the global project_roots (a shared area)")

    @field_validator("roots")
    @classmethod
    def _roots(cls, value: list[str]) -> list[str]:
        return _absolute(value)

    @model_validator(mode="after")
    def _someone(self) -> TeamRoots:
        if not self.channels and not self.groups:
            raise ValueError("name the channels (C…) and/or user groups (S…) these roots "
                             "are for")
        return self


class PolicyFile(Section):
    """``$PREFLIGHT_POLICY`` (default ``$PREFLIGHT_HOME/policy.yaml``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="Preflight bot policy")

    roles: Roles = Field(default_factory=Roles)
    nodes: list[str] | None = Field(
        default=None, description='nodes a Slack manifest may name: "local", "HOST", '
                                  '"HOST:PORT" or "USER@HOST[:PORT]", each optionally '
                                  'followed by its host key "SHA256:…"; null: any SSH node')
    project_roots: list[str] | None = Field(
        default=None, description="absolute directories Slack manifests may read and write "
                                  "in; null: $PREFLIGHT_HOME/projects")
    team_roots: list[TeamRoots] = Field(
        default_factory=list, description="per channel or user group: their own roots "
                                          "instead of project_roots")
    node_corpus_roots: list[str] | None = Field(
        default=None, description="absolute directories on the nodes under which a Slack "
                                  "manifest's volume.inputs.on_nodes may lie (a corpus "
                                  "already on the nodes); null: on_nodes refused from Slack")
    task_command: TaskCommand = Field(default_factory=TaskCommand)
    approvals: Approvals = Field(default_factory=Approvals)
    spending: Spending = Field(default_factory=Spending)

    @field_validator("nodes")
    @classmethod
    def _nodes(cls, value: list[str] | None) -> list[str] | None:
        for entry in value or []:
            parse_node(entry)
        return value

    @field_validator("project_roots")
    @classmethod
    def _roots(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else _absolute(value)

    @field_validator("node_corpus_roots")
    @classmethod
    def _node_roots(cls, value: list[str] | None) -> list[str] | None:
        for entry in value or []:
            if not entry.startswith("/") or ".." in entry.split("/"):
                raise ValueError(f"{entry!r}: an absolute path on the nodes, without '..'")
        return value


def _absolute(value: list[str]) -> list[str]:
    for entry in value:
        if not entry.startswith("/"):
            raise ValueError(f"{entry!r} is not an absolute path: a root is a directory "
                             "on the bot host, e.g. /srv/preflight/projects")
    return value


def parse_node(entry: str) -> tuple[str | None, str]:
    """``"local"`` -> (None, "local"); ``"u@h:2222"`` -> ("u", "h:2222") (the lease key)."""
    user, key, _ = parse_node_entry(entry)
    return user, key


def parse_node_entry(entry: str) -> tuple[str | None, str, str | None]:
    """A ``nodes`` entry: (user or None, lease key, pinned host key or None);
    ``"u@h:2222 SHA256:…"`` pins the host key a Slack manifest may name for that node."""
    from bot.pilot.leases import lease_key

    text, _, pin = entry.strip().partition(" ")
    pin = pin.strip()
    if pin and not re.match(FINGERPRINT, pin):
        raise ValueError(f"{entry!r}: after the node, expected its host key as "
                         "\"SHA256:…\" (ssh-keygen -lf)")
    if text == "local":
        if pin:
            raise ValueError(f"{entry!r}: local has no host key")
        return None, "local", None
    user, _, address = text.rpartition("@")
    if not address or any(c.isspace() for c in text) or "/" in text:
        raise ValueError(f"{entry!r}: expected \"local\", HOST, HOST:PORT or USER@HOST[:PORT]")
    try:
        host, port = split_key(address)
    except LeaseError as exc:
        raise ValueError(str(exc)) from exc
    return (user or None), lease_key(host, port), (pin or None)
