"""What a killed driver's cleanup may end: Ray's own processes of its group, nothing else
that shares the group (runner.volume_ray.session_pids)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from runner.volume_ray import _ray_program, session_pids


def test_only_rays_own_programs_count() -> None:
    assert _ray_program(b"ray::IDLE\0")
    assert _ray_program(b"ray::DashboardAgent\0--x\0")
    assert _ray_program(b"/v/bin/python\0/v/site-packages/ray/dashboard/agent.py\0--a\0")
    assert _ray_program(b"/v/site-packages/ray/core/src/ray/raylet/raylet\0--x\0")
    # an all-reduce rank whose sys.path argument names Ray's thirdparty folder
    assert not _ray_program(b"/v/bin/python\0-c\0import sys\0"
                            b"[\"/v/site-packages/ray/thirdparty_files\"]\0")


def test_a_process_of_the_group_whose_arguments_name_ray_is_left_alone(tmp_path: Path) -> None:
    sleeper = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)",
         "/v/site-packages/ray/thirdparty_files", "ray"])
    try:
        time.sleep(0.2)
        found = session_pids(str(tmp_path / "no-such-session"), os.getpgid(0))
        assert sleeper.pid not in found and sleeper.poll() is None
    finally:
        sleeper.kill()
        sleeper.wait()
