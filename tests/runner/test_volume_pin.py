"""Ray is pinned in one place (runner.raypin); pyproject.toml must say the same."""

from __future__ import annotations

from pathlib import Path

import tomllib

from runner.raypin import RAY_VERSION, install_command

REPO = Path(__file__).resolve().parents[2]


def test_pyproject_pins_the_runner_s_ray_version() -> None:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    rays = [d for d in deps if d.replace(" ", "").lower().startswith("ray")]
    assert rays == [f"ray=={RAY_VERSION}"]


def test_the_install_hint_names_the_pinned_version() -> None:
    assert install_command("/opt/py/bin/python3") == \
        f"/opt/py/bin/python3 -m pip install 'ray=={RAY_VERSION}'"
