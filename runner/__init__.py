"""Preflight runner: the stdlib-only program that runs diagnostics and the pilot on a node.

Nothing here imports ``bot``; heavy libraries (torch, extensions) are imported inside the
stages that check them, so a bare node can still report what is missing.
"""

__version__ = "0.1.0"
