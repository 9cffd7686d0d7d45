"""Finding runs: state/ found walking up from any folder of the project, PREFLIGHT_HOME,
`latest` and a pilot's name, did-you-mean, `runs` in 80 columns, `--version`."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bot.manifest.load import load_manifest_file
from tests.bot.fakes import pilot_script, write_manifest
from tests.bot.test_service import IDS, make


def cli(cwd: Path, *args: str, home: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFLIGHT_", "SLACK_"))}
    env["COLUMNS"] = "80"
    if home is not None:
        env["PREFLIGHT_HOME"] = str(home)
    return subprocess.run([sys.executable, "-m", "bot", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    root = tmp_path_factory.mktemp("proj")
    service, _ = make(root, lambda run: pilot_script(IDS, refuse=()))
    ids = []
    for name in ("keyword-sentiment", "keyword-sentiment", "other"):
        sub = service.submit(load_manifest_file(write_manifest(root, name=name)),
                             submitter="bob")
        service.starter.start(sub.run_id)
        service.follower.follow(sub.run_id, timeout=30)
        ids.append(sub.run_id)
    (root / "src" / "deeper").mkdir(parents=True)
    return root, ids


def test_state_is_found_from_any_folder_inside_the_project(
        project: tuple[Path, list[str]]) -> None:
    root, ids = project
    deep = root / "src" / "deeper"
    shown = cli(deep, "show", "latest", "--json")
    assert shown.returncode == 0, shown.stderr
    assert f'"id": "{ids[2]}"' in shown.stdout
    by_name = cli(deep, "show", "keyword-sentiment", "--json")
    assert f'"id": "{ids[1]}"' in by_name.stdout  # the pilot's newest run
    assert not (deep / "state").exists()


def test_runs_shows_the_pilot_name_and_fits_80_columns(project: tuple[Path, list[str]]) -> None:
    root, ids = project
    listed = cli(root / "src", "runs")
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert all(len(line) <= 80 for line in lines), lines
    assert any("keyword-sentiment a2" in line and ids[1].split("-")[0] in line
               for line in lines), lines


def test_an_unknown_run_gets_did_you_mean(project: tuple[Path, list[str]]) -> None:
    root, _ = project
    typo = cli(root, "show", "keyword-sentimnt")
    assert typo.returncode == 2
    assert "did you mean keyword-sentiment?" in " ".join(typo.stderr.split())


def test_outside_any_project_it_says_so_and_creates_nothing(
        project: tuple[Path, list[str]], tmp_path: Path) -> None:
    root, ids = project
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    lost = cli(elsewhere, "runs")
    assert lost.returncode == 2
    assert "no Preflight state here" in " ".join(lost.stderr.split())
    assert not (elsewhere / "state").exists()
    homed = cli(elsewhere, "show", "latest", "--json", home=root)  # PREFLIGHT_HOME
    assert homed.returncode == 0 and f'"id": "{ids[2]}"' in homed.stdout


def test_version(tmp_path: Path) -> None:
    done = cli(tmp_path, "--version")
    assert done.returncode == 0 and done.stdout.startswith("preflight ")
