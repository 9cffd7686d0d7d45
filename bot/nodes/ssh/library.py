"""asyncssh, imported once and quietly.

cryptography 47+ deprecates DSA, and asyncssh's import names DSA types: a fresh install
printed five ``CryptographyDeprecationWarning`` lines on every command that loads the SSH
kind (``preflight serve`` in the terminal included). Preflight never offers or accepts DSA
(asyncssh's defaults no longer do), so that one warning, at that one import, is silenced;
any other warning still shows.
"""

from __future__ import annotations

import warnings

with warnings.catch_warnings():
    warnings.filterwarnings("ignore", message="DSA is deprecated")
    import asyncssh

__all__ = ["asyncssh"]
