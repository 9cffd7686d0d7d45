"""The one place Ray's version is pinned (pyproject.toml lists the same; a test checks).

Ray refuses to join nodes whose versions differ, even by a patch release, so every node of
a volume needs exactly this version, installed by the command below.
"""

from __future__ import annotations

RAY_VERSION = "2.60.0"


def install_command(python: str = "python3") -> str:
    """The command that installs the pinned Ray into ``python``'s environment."""
    return f"{python} -m pip install 'ray=={RAY_VERSION}'"
