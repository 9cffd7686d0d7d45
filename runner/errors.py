"""The runner's one error base (part of the bot/runner contract; standard library only).

Every error the runner raises on purpose derives from ``RunnerError``: a stage's
``StageFailure``, and the errors of the pieces a stage or the bot uses (spec, events,
inputs, ledger, evidence, versions, workloads). The bot catches ``RunnerError`` where it
calls a contract function and translates it into its own ``PreflightError``
(``raise … from exc``), so nothing of the runner's tree reaches a transport.
"""

from __future__ import annotations


class RunnerError(Exception):
    """Base of every expected failure raised by the runner's code."""


__all__ = ["RunnerError"]
