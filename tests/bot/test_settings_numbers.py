"""Settings' positive numbers from the environment (seconds, bytes): one parser, one clear
error naming the variable, its value and the unit expected."""

from __future__ import annotations

from pathlib import Path

import pytest

from bot.errors import PreflightError
from bot.settings import Settings


def test_seconds_default_when_unset_and_take_any_positive_number(tmp_path: Path) -> None:
    home = {"PREFLIGHT_HOME": str(tmp_path)}
    assert Settings.from_env(home).contact_give_up_s == 600.0
    assert Settings.from_env({**home, "PREFLIGHT_SSH_GIVE_UP_S": ""}).contact_give_up_s == 600.0
    assert Settings.from_env({**home, "PREFLIGHT_SSH_GIVE_UP_S": "1e3"}).contact_give_up_s == 1000.0
    assert Settings.from_env({**home, "PREFLIGHT_SSH_GIVE_UP_S": "0.5"}).contact_give_up_s == 0.5


@pytest.mark.parametrize("value", ["0", "-2", "nan", "soon"])
def test_unusable_seconds_are_one_clear_error(tmp_path: Path, value: str) -> None:
    with pytest.raises(PreflightError) as caught:
        Settings.from_env({"PREFLIGHT_HOME": str(tmp_path), "PREFLIGHT_TRANSFER_STALL_S": value})
    assert str(caught.value).startswith(
        f"PREFLIGHT_TRANSFER_STALL_S={value!r}: expected a positive number of seconds")


@pytest.mark.parametrize("value", ["1.5", "1e3", "0"])
def test_bytes_must_be_a_positive_whole_number(tmp_path: Path, value: str) -> None:
    with pytest.raises(PreflightError) as caught:
        Settings.from_env({"PREFLIGHT_HOME": str(tmp_path), "PREFLIGHT_HTTP_MAX_BODY": value})
    assert str(caught.value).startswith(
        f"PREFLIGHT_HTTP_MAX_BODY={value!r}: expected a positive whole number of bytes")
