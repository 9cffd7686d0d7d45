"""The runner under ``python -I`` on a Python with only the standard library and torch.

How the bare node is built: a fresh ``python -m venv --without-pip`` in tmp_path, whose
site-packages gets one ``.pth`` line naming a folder of symlinks to exactly torch and the
distributions torch requires (found from its metadata), plus the ``runner`` package. So
pydantic, slack, PyYAML, ... are not importable there, and ``-I`` ignores PYTHONPATH, the
user site and the current directory.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from runner.requirements import evaluate_marker, normalize_name
from tests.runner.test_stages_kit import REPO, events_of, status_of, write_spec


def torch_closure() -> list[metadata.Distribution]:
    seen: dict[str, metadata.Distribution] = {}
    todo = ["torch"]
    while todo:
        name = todo.pop()
        if normalize_name(name) in seen:
            continue
        dist = metadata.distribution(name)
        seen[normalize_name(name)] = dist
        for req in dist.requires or []:
            marker = req.split(";", 1)[1] if ";" in req else None
            if marker and ("extra" in marker or not evaluate_marker(marker)):
                continue
            match = re.match(r"[A-Za-z0-9._-]+", req)
            assert match is not None
            todo.append(match.group(0))
    return list(seen.values())


def make_bare_python(tmp_path: Path) -> Path:
    venv = tmp_path / "bare"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True,
                   timeout=120)
    shelf = tmp_path / "shelf"
    shelf.mkdir()
    for dist in torch_closure():
        for top in {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}:
            source = Path(str(dist.locate_file(top)))
            if top == "__pycache__" or top.endswith(".pth") or not source.exists():
                continue
            if not (shelf / top).exists():
                (shelf / top).symlink_to(source)
    (shelf / "runner").symlink_to(REPO / "runner")
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "bare_node.pth").write_text(str(shelf) + "\n")
    return venv / "bin" / "python"


def test_runner_completes_under_isolated_mode_with_only_torch(tmp_path: Path) -> None:
    python = make_bare_python(tmp_path)
    probe = subprocess.run([str(python), "-I", "-c", "import pydantic"], capture_output=True,
                           text=True, timeout=60, check=False, cwd=tmp_path)
    assert probe.returncode != 0 and "No module named 'pydantic'" in probe.stderr
    spec = write_spec(tmp_path)
    run_dir = tmp_path / "run"
    done = subprocess.run(
        [str(python), "-I", "-m", "runner", str(spec), "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    events = events_of(run_dir)
    status = status_of(events)
    assert status["torch"] == "passed" and status["compute"] == "passed"
    assert status["pilot"] == "passed" and status["balance"] == "passed"
    env = json.loads((run_dir / "environment.json").read_text())
    interp = env["stages"]["interpreter"]["facts"]
    assert interp["isolated"] is True
    assert interp["executable"] == str(python)
    assert interp["virtualenv"] == str(tmp_path / "bare")
