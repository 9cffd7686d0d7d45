"""The remote tests' real sshd (and a second one, another "node" for the several-node
volume): each started once per session on a free port, stopped after."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.remote.sshd_server import BARE_PYTHON, FAKE_RUNNER, Sshd, running_sshd

__all__ = ["BARE_PYTHON", "FAKE_RUNNER", "Sshd", "sshd", "sshd2"]


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    with running_sshd(tmp_path_factory.mktemp("sshd")) as server:
        yield server


@pytest.fixture(scope="session")
def sshd2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    """A second node: its own sshd, port, host key and user key."""
    with running_sshd(tmp_path_factory.mktemp("sshd2")) as server:
        yield server
