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



# Test files that start a Ray: under `make test`'s pytest-xdist workers (--dist loadfile)
# they are two units of work, two lanes, so at most two of their Rays run at once (a pilot's
# calibration elsewhere may add one: any pilot with a volume):
# - "ray": the Rays started as a node's would be (`ray start` on loopback "nodes": the SSH
#   and container volumes, the million bench), and the tests that start theirs in the test
#   process with the kit's one token (ray.cluster_utils' three-node cluster starts its GCS
#   where a `ray start` may start one: make test saw "Failed to start GCS" with the two
#   beside each other, and InvalidAuthToken for the kit's in-process tests beside others);
# - "ray-volume": the runner's own local Ray (ray.init on a free port, in a subprocess):
#   tests/volume/'s other files, the benches that run a local volume, the forecast CLI.
# What the tests look for on the whole machine is their own run's: its process groups and
# temp dirs, its actors by the marker in their environment (tests/volume/kit.py's
# our_actor_pids), its own home for Ray's token file.
# Every other file is a unit of its own: its tests stay on one worker, with its fixtures.
# (xdist's own --dist loadgroup renames test ids in a way pytest 9 no longer sees.)
# tests/test_bench.py is split per bench: only a bench whose text names Ray or a volume
# joins a lane (the others, Slack, SSH, Blender, the ledger, run beside them).
NODE_RAY_FILES = ("tests/remote/test_ray_", "tests/remote/test_volume_",
                  "tests/cluster_kit/test_cluster_service.py")
LOCAL_RAY_FILES = ("tests/volume/", "tests/e2e/test_forecast_cli.py")
BENCH_TEST = "tests/test_bench.py"
NODE_RAY_BENCHES = ("million",)  # loopback sshd nodes, each a `ray start`
CLUSTER_TEST = "tests/volume/test_volume_cluster.py"
KIT_TOKEN_TESTS = (CLUSTER_TEST, "tests/volume/test_volume_collect.py",
                   "tests/volume/test_volume_bad_outputs.py")


def _bench_stem(nodeid: str) -> str:
    return nodeid.rsplit("[", 1)[-1].rstrip("]") if nodeid.endswith("]") else ""


def _bench_starts_ray(nodeid: str) -> bool:
    """A bench smoke run (``...[<stem>]``) whose bench/<stem>.py mentions Ray or a volume;
    the format test and an unknown stem count as Ray (the safe side)."""
    stem = _bench_stem(nodeid)
    path = REPO / "bench" / f"{stem}.py"
    if not stem or not path.is_file():
        return True
    text = path.read_text(encoding="utf-8").lower()
    return "ray" in text.replace("array", "") or "volume" in text


def _scope(nodeid: str) -> str:
    path = nodeid.split("::", 1)[0]
    if path in KIT_TOKEN_TESTS or path.startswith(NODE_RAY_FILES):
        return "ray"
    if path.startswith(LOCAL_RAY_FILES):
        return "ray-volume"
    if path == BENCH_TEST:
        if not _bench_starts_ray(nodeid):
            return nodeid
        return "ray" if _bench_stem(nodeid) in NODE_RAY_BENCHES or not _bench_stem(nodeid) \
            else "ray-volume"
    return path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object | None:
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class RayFilesTogether(LoadFileScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return _scope(nodeid)

    return RayFilesTogether(config, log)
