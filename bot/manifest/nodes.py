"""The manifest's node models: one per node kind, told apart by ``kind``.

``Node`` is the union of the kinds (``local`` when a section names none); each kind's model
says what it is (``is_remote``, ``identity``, ``words``, ``label``), so the rules, the policy,
the leases, the plan and the reports ask the typed node. This module and ``bot/nodes/`` (the
adapters) are the only code that names a kind (``tests/test_boundaries.py``); a new kind
adds its model here and its adapter there.
"""

from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import (
    Field,
    TypeAdapter,
    ValidationError,
    ValidatorFunctionWrapHandler,
    WrapValidator,
)
from pydantic_core import PydanticCustomError

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


# The kinds the manifest takes, by name: the two built in here, and any a registry adds
# (``register_node_model``; ``bot.nodes.registry.register`` adds a kind's model and its
# adapter together, so a kind defined elsewhere, a test's, needs no edit of this module).
NODE_MODELS: dict[str, type[NodeSpec]] = {"local": LocalNode, "ssh": SSHNodeSpec}
DEFAULT_NODE_KIND = "local"  # a node section that names no kind


def register_node_model(model: type[NodeSpec]) -> str:
    """Make the manifest take ``model``'s kind (its ``kind`` field's one literal value);
    returns that name. A name already taken by another model is refused."""
    field = model.model_fields.get("kind")
    args: tuple[Any, ...] = getattr(field.annotation, "__args__", ()) if field else ()
    name = args[0] if len(args) == 1 else None
    if not isinstance(name, str):
        raise TypeError(f"{model.__name__}.kind must be typed Literal[\"<kind>\"]")
    if NODE_MODELS.get(name, model) is not model:
        raise ValueError(f"node kind {name!r} is already {NODE_MODELS[name].__name__}")
    NODE_MODELS[name] = model
    return name


def unregister_node_model(name: str) -> None:
    """Take a kind a registry added away again (a test's, at its end)."""
    NODE_MODELS.pop(name, None)


def _validate_node(value: Any, handler: ValidatorFunctionWrapHandler) -> NodeSpec:
    """A node section as the model of its kind, looked up when it is validated (so a kind
    registered after this module was imported is taken). Its errors keep the section's own
    paths (``node.port``, never a union tag); an unknown kind is a ``node_kind`` error said
    of the section's ``kind``."""
    if isinstance(value, NodeSpec):
        return value
    if not isinstance(value, dict):
        handler(value)  # raises pydantic's own "a valid dictionary or instance of" error
        raise AssertionError("unreachable")  # pragma: no cover
    kind = value.get("kind", DEFAULT_NODE_KIND)
    model = NODE_MODELS.get(kind) if isinstance(kind, str) else None
    if model is None:
        raise PydanticCustomError(
            "node_kind", "Input should be {kinds}",
            {"kinds": " or ".join(repr(k) for k in NODE_MODELS)})
    return model.model_validate(value)


# (the JSON schema, made once at import, shows the built-in kinds)
Node = Annotated[NodeSpec, WrapValidator(_validate_node,
                                         json_schema_input_type=LocalNode | SSHNodeSpec)]
NODE_ADAPTER: TypeAdapter[NodeSpec] = TypeAdapter(Node)


def node_model(node: Any) -> type[NodeSpec] | None:
    """The model of a node section's kind (``local`` when it names none), read without
    validating the rest: for screens of a manifest not yet checked (the policy's); None
    for a kind that is not one."""
    kind = node.get("kind", DEFAULT_NODE_KIND) if isinstance(node, dict) else None
    return NODE_MODELS.get(kind) if isinstance(kind, str) else None


def remote_kinds() -> list[str]:
    """The kinds whose node is another machine than the bot host (leased, by host)."""
    return sorted(name for name, model in NODE_MODELS.items() if model.is_remote)


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
