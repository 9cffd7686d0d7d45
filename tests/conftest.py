"""Shared test setup: no test sees the developer's Slack or Preflight environment."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in list(os.environ):
        if name.startswith(("SLACK_", "PREFLIGHT_")):
            monkeypatch.delenv(name, raising=False)
    yield


@pytest.fixture
def repo() -> Path:
    return REPO
