"""What every part of the store relies on: a per-thread connection and transactions."""

from __future__ import annotations

from contextlib import AbstractContextManager

import sqlite_utils


class StoreBase:
    """Implemented by ``bot.store.Store``; the mixins are written against this."""

    @property
    def db(self) -> sqlite_utils.Database:
        raise NotImplementedError

    def transaction(self) -> AbstractContextManager[sqlite_utils.Database]:
        raise NotImplementedError
