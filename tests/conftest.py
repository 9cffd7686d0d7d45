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



# Test files that start a Ray: under `make test`'s two pytest-xdist workers (--dist
# loadfile) they are two units of work, two lanes: tests/volume/ and the rest, so at most
# two Rays run at once (a pilot's calibration may add one: any pilot with a volume). What
# the tests look for on the whole machine is their own run's: its process groups and temp
# dirs, its actors by the marker in their environment (tests/volume/kit.py's
# our_actor_pids), its own home for Ray's token file.
# Every other file is a unit of its own: its tests stay on one worker, with its fixtures.
# (xdist's own --dist loadgroup renames test ids in a way pytest 9 no longer sees.)
# tests/test_bench.py is split per bench: only a bench whose text names Ray or a volume
# joins the group (the others, Slack, SSH, Blender, the ledger, run beside it).
RAY_FILES = ("tests/volume/", "tests/remote/test_ray_", "tests/remote/test_volume_",
             "tests/e2e/test_forecast_cli.py", "tests/cluster_kit/test_cluster_service.py")
BENCH_TEST = "tests/test_bench.py"
# ray.cluster_utils' three-node cluster starts its GCS where a `ray start` of the SSH tests
# may start one (make test saw "Failed to start GCS" with the two beside each other): it
# stays in the "ray" lane, one after those.
CLUSTER_TEST = "tests/volume/test_volume_cluster.py"
# The tests that start their Ray in the test process with the kit's one token per process
# (tests/volume/kit.py cluster_env): together, in the "ray" lane, whose other files start
# Ray only in subprocesses (make test saw InvalidAuthToken beside the local-Ray tests).
KIT_TOKEN_TESTS = (CLUSTER_TEST, "tests/volume/test_volume_collect.py",
                   "tests/volume/test_volume_bad_outputs.py")


def _bench_starts_ray(nodeid: str) -> bool:
    """A bench smoke run (``...[<stem>]``) whose bench/<stem>.py mentions Ray or a volume;
    the format test and an unknown stem count as Ray (the safe side)."""
    stem = nodeid.rsplit("[", 1)[-1].rstrip("]") if nodeid.endswith("]") else ""
    path = REPO / "bench" / f"{stem}.py"
    if not stem or not path.is_file():
        return True
    text = path.read_text(encoding="utf-8").lower()
    return "ray" in text.replace("array", "") or "volume" in text


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path.startswith("tests/volume/") and path not in KIT_TOKEN_TESTS:
        return "ray-volume"  # a lane of its own beside "ray": its checks see only its Ray
    if path == BENCH_TEST:
        return "ray" if _bench_starts_ray(nodeid) else nodeid
    return "ray" if path.startswith(RAY_FILES) else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayFilesTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return RayFilesTogether(config, log)
