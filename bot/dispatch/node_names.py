"""The one check every name a node hands back passes before the bot uses it.

Once a team's code has run on a node as the SSH login user, every later answer of that
node can be the team's (a ``command="…"`` prefix in ``~/.ssh/authorized_keys`` routes each
session, the SFTP subsystem included, through a program they chose): a directory listing
can name ``../../victim.txt``. So a name from a node, at any depth (a fetched folder's
entries, a listed corpus, the node's file hashes), is one plain path component: not
empty, not ``.`` or ``..``, no ``/``, no NUL. Anything else refuses the whole step, naming
the node and where the name was found (docs/security.md).
"""

from __future__ import annotations

from bot.errors import DispatchError


class NodeNameRefused(DispatchError):
    """A node answered a name that is not one plain path component."""


def node_name(name: object, where: str, folder: str) -> str:
    """``name`` (from ``where``, a node, listed in ``folder``) if it is one plain path
    component; else ``NodeNameRefused`` naming the node, the folder and the name."""
    if isinstance(name, str) and name not in ("", ".", "..") and "/" not in name \
            and "\0" not in name:
        return name
    shown = name[:200] if isinstance(name, (str, bytes)) else name
    raise NodeNameRefused(
        f"{where}: the node answered the name {shown!r} in {folder}: a name from a node must "
        "be one plain path component (not empty, '.' or '..', no '/', no NUL), so it is "
        "refused and nothing was written or removed on the bot host. The node's SSH or SFTP "
        "answers are not its files' (check ~/.ssh/authorized_keys on the node for a "
        "command= prefix, and the SFTP server)")


def node_relpath(path: object, where: str, folder: str) -> str:
    """A relative path from a node (``a/b/c``): each of its components passes
    ``node_name``."""
    if not isinstance(path, str):
        return node_name(path, where, folder)
    for part in path.split("/"):
        node_name(part, where, folder)
    return path


def listed_names(names: list[str], where: str, folder: str) -> list[str]:
    """A folder's listing from a node: ``.`` and ``..`` (which every SFTP server lists)
    left out, every other name checked by ``node_name``."""
    return [node_name(n, where, folder) for n in names if n not in (".", "..")]
