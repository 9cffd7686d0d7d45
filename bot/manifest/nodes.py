"""The manifest's node models: one per node kind, told apart by ``kind``.

``Node`` is the union of the kinds (``local`` when a section names none); each kind's model
says what it is (``is_remote``, ``identity``, ``words``, ``label``), so the rules, the policy,
the leases, the plan and the reports ask the typed node. This module and ``bot/nodes/`` (the
adapters) are the only code that names a kind (``tests/test_boundaries.py``); a new kind
adds its model here and its adapter there.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import Discriminator, Field, Tag, TypeAdapter, ValidationError

from bot.manifest.types import Int, NonEmpty, Section


class NodeSpec(Section):
    """What every node kind reads from a ``node`` section (the fields are shared, so a
    field another kind ignores gets a rule's warning, not a parse error); each kind is a
    subclass that fixes ``kind`` and says what it is (``is_remote``, its words). The
    manifest takes ``Node``, the union of the kinds, told apart by ``kind`` (``local`` when
    absent). This module and ``bot/nodes/`` are the only code that names a kind
    (``tests/test_boundaries.py``): everything else asks the typed node."""

    kind: str
    host: NonEmpty | None = None
    port: Int = Field(default=22, ge=1, le=65535)
    user: NonEmpty | None = None
    workdir: NonEmpty | None = None
    python: NonEmpty | None = Field(
        default=None, description="the node's interpreter, the one the project runs with "
        "(ssh: python3 when unset; local: Preflight's own interpreter when unset, said in "
        "the plan)")
    host_key_fingerprint: str | None = Field(
        default=None, pattern=r"^SHA256:[A-Za-z0-9+/]{43}=?$",
        description='pinned host key, "SHA256:..." as printed by ssh-keygen -lf')
    stall_after_s: Int = Field(default=600, ge=1,
                               description="alert after this many seconds without an event")
    ray_port: Int | None = Field(
        default=None, ge=1024, le=60000,
        description="a several-node volume: the first of this node's Ray ports (its GCS on "
                    "the head, then 6 more), its workers' ports moved as far from 11000 "
                    "(null: 6380 and 11000, and a node on the same host as an earlier one "
                    "100 higher)")

    # another machine, reached over the network (a lease, a host, a workdir); else the bot
    # host itself
    is_remote: ClassVar[bool] = False

    @property
    def identity(self) -> str:
        """What makes two nodes the same machine: ``local``, or ``ssh://host:port``."""
        return node_identity(self.model_dump())

    @property
    def words(self) -> str:
        """The node in a plan's words: ``this machine``, or ``user@host[:port]``."""
        if not self.is_remote:
            return "this machine"
        port = f":{self.port}" if self.port != 22 else ""
        return f"{self.user + '@' if self.user else ''}{self.host}{port}"

    @property
    def label(self) -> str:
        """``local (the bot host itself)`` or ``ssh user@host:port``."""
        if not self.is_remote:
            return f"{self.kind} (the bot host itself)"
        user = f"{self.user}@" if self.user else ""
        return f"{self.kind} {user}{self.host}:{self.port}"

    @property
    def host_label(self) -> str:
        """The machine alone: ``the bot host``, or the node's host."""
        return str(self.host) if self.is_remote else "the bot host"


class LocalNode(NodeSpec):
    """The runner on the bot host itself."""

    kind: Literal["local"] = "local"


class SSHNodeSpec(NodeSpec):
    """A rented node reached over SSH (``host`` required by the rules, ``workdir`` advised)."""

    kind: Literal["ssh"]
    is_remote: ClassVar[bool] = True


NODE_MODELS: dict[str, type[NodeSpec]] = {"local": LocalNode, "ssh": SSHNodeSpec}
DEFAULT_NODE_KIND = "local"  # a node section that names no kind


def _node_tag(value: Any) -> str | None:
    """The union's tag of a node section: ``node[<kind>]`` (``local`` when it names none).
    The brackets make pydantic's error paths skip it as a union tag (``source.format_loc``),
    so an error reads ``node.port``, not ``node.ssh.port``."""
    if isinstance(value, NodeSpec):
        return f"node[{value.kind}]"
    kind = value.get("kind", DEFAULT_NODE_KIND) if isinstance(value, dict) else DEFAULT_NODE_KIND
    return f"node[{kind}]" if isinstance(kind, str) and kind in NODE_MODELS else None


Node = Annotated[Annotated[LocalNode, Tag("node[local]")]
                 | Annotated[SSHNodeSpec, Tag("node[ssh]")],
                 Discriminator(_node_tag, custom_error_type="node_kind",
                               custom_error_message="Input should be "
                               + " or ".join(repr(k) for k in NODE_MODELS))]
NODE_ADAPTER: TypeAdapter[LocalNode | SSHNodeSpec] = TypeAdapter(Node)


def node_model(node: Any) -> type[NodeSpec] | None:
    """The model of a node section's kind (``local`` when it names none), read without
    validating the rest: for screens of a manifest not yet checked (the policy's); None
    for a kind that is not one."""
    kind = node.get("kind", DEFAULT_NODE_KIND) if isinstance(node, dict) else None
    return NODE_MODELS.get(kind) if isinstance(kind, str) else None


def is_remote_node(node: Any) -> bool:
    """Whether a node section (not validated) names another machine than the bot host."""
    model = node_model(node)
    return model is not None and model.is_remote


def node_identity(node: Any) -> str:
    """What makes two node sections (not validated: a spec's copy) the same machine:
    ``local``, or ``ssh://host:port`` (the host in lower case)."""
    node = node if isinstance(node, dict) else {}
    kind = str(node.get("kind") or DEFAULT_NODE_KIND)
    if not is_remote_node({**node, "kind": kind}):
        return kind
    return f"{kind}://{str(node.get('host') or '').strip().lower()}:{node.get('port') or 22}"


def node_spec(node: Any) -> NodeSpec | None:
    """A stored node section (a run record's) as its typed node; None when there is none or
    it no longer validates (a record from before a field was renamed)."""
    if node is None:
        return None
    try:
        return NODE_ADAPTER.validate_python(node)
    except ValidationError:
        return None
