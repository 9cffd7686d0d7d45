"""The fetch's size caps come from the bot's settings (PREFLIGHT_FETCH_MAX_BYTES,
PREFLIGHT_FETCH_MAX_FILE_BYTES) and reach the SSH dispatcher."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.errors import PreflightError
from bot.nodes.registry import make_dispatchers
from bot.nodes.ssh.fetch import FetchLimits
from bot.settings import Settings


def test_the_fetch_caps_default_to_4_and_2_gib_and_are_set_from_the_environment(
        tmp_path: Path) -> None:
    default = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path)})
    assert (default.fetch_max_bytes, default.fetch_max_file_bytes) == (4 << 30, 2 << 30)
    settings = Settings.from_env({"PREFLIGHT_HOME": str(tmp_path),
                                  "PREFLIGHT_FETCH_MAX_BYTES": "5000",
                                  "PREFLIGHT_FETCH_MAX_FILE_BYTES": "1000"})
    ssh = make_dispatchers(settings)["ssh"]
    try:
        assert ssh.fetch_limits == FetchLimits(total_bytes=5000,  # type: ignore[attr-defined]
                                               file_bytes=1000)
    finally:
        ssh.close()


@pytest.mark.parametrize("value", ["0", "-1", "4G", "lots"])
def test_an_unusable_fetch_cap_is_one_clear_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(PreflightError, match="PREFLIGHT_FETCH_MAX_BYTES=.*positive whole"):
        Settings.from_env({"PREFLIGHT_HOME": str(tmp_path), "PREFLIGHT_FETCH_MAX_BYTES": value})
