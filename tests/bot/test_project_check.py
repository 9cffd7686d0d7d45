"""`check-project`: the guide's layout, pinned requirements, no machine-specific paths."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bot.errors import Problem, ProjectCheckError
from bot.manifest.load import load_manifest_file
from bot.manifest.project_check import check_project, precheck_manifest
from tests.bot.manifest_helpers import BASE, dump, make_project, merged

REPO = Path(__file__).resolve().parents[2]


def good_project(root: Path) -> Path:
    make_project(root)
    (root / "README.md").write_text("# pilot\n")
    (root / "requirements-rebuild.txt").write_text(
        "# rebuild\ntorch>=2.1,<3\nnumpy==1.26.4  # pinned\npydantic[email]~=2.7\n"
        "mylib @ https://example.net/mylib-1.0.tar.gz\n-r extra.txt\n"
        "rich>=13 ; python_version >= '3.9'\n"
        "git+https://github.com/org/repo.git@0a1b2c3#egg=repo\n./vendor/pkg-1.0-py3-none-any.whl\n")
    for folder in ("src", "runs", "config"):
        (root / folder).mkdir()
    (root / "config" / "pilote.json").write_text(json.dumps(
        {"threshold": 0.5, "labels": "config/labels.txt", "url": "https://example.net/x"},
        indent=2))
    (root / "pilot.yaml").write_text(dump(BASE))
    return root


def errors(problems: list[Problem]) -> dict[str, Problem]:
    return {f"{Path(p.file or '').name}:{p.loc}": p for p in problems if p.severity == "error"}


def test_good_project_passes(tmp_path: Path) -> None:
    problems = check_project(good_project(tmp_path))
    assert problems == []


def test_missing_layout(tmp_path: Path) -> None:
    found = {p.loc: p.severity for p in check_project(tmp_path)}
    assert found == {"README.md": "error", "requirements-rebuild.txt": "error",
                     "data/pilote": "error", "src/": "warning", "config/": "warning",
                     "runs/": "warning"}


@pytest.mark.parametrize("line, fragment", [
    ("torch", "not pinned"), ("numpy >= one", "cannot read"), ("!!", "cannot read"),
    ("git+https://github.com/org/repo.git#egg=repo", "pin it to a commit"),
    ("git+https://github.com/org/repo.git", "moving branch"),
])
def test_requirements_lines(tmp_path: Path, line: str, fragment: str) -> None:
    root = good_project(tmp_path)
    with open(root / "requirements-rebuild.txt", "a") as fh:
        fh.write(line + "\n")
    last = len((root / "requirements-rebuild.txt").read_text().splitlines())
    [problem] = [p for p in check_project(root) if p.severity == "error"]
    assert fragment in problem.message and problem.line == last == 10


def test_config_findings_name_file_and_line(tmp_path: Path) -> None:
    root = good_project(tmp_path)
    (root / "config" / "paths.json").write_text(
        '{\n  "model": "/home/alice/models/m.bin",\n  "api_token": "abc123",\n'
        '  "cache": "~/cache"\n}\n')
    (root / "config" / "broken.json").write_text('{\n  "a": 1,\n}\n')
    found = errors(check_project(root))
    assert found["paths.json:model"].line == 2
    assert "home-directory" in found["paths.json:model"].message
    assert found["paths.json:api_token"].line == 3
    assert found["paths.json:cache"].line == 4
    assert found["broken.json:(document)"].line == 3


def test_manifest_paths(tmp_path: Path) -> None:
    root = good_project(tmp_path)
    (root / "pilot.yaml").write_text(dump(merged(
        inputs={"dir": "../elsewhere"}, project={"params": {"w": "C:\\Users\\bob\\w.bin",
                                                            "tmp": "/opt/cache"}},
        results={"copy_to": "/srv/evidence"}, node={"kind": "ssh", "workdir": "/home/u/p"})))
    problems = check_project(root)
    found = errors(problems)
    assert set(found) == {"pilot.yaml:inputs.dir", "pilot.yaml:project.params.w"}
    assert "leaves the project" in found["pilot.yaml:inputs.dir"].message
    warned = {p.loc for p in problems if p.severity == "warning"}
    assert warned == {"project.params.tmp", "node.workdir"}  # a node's path: a warning


def test_a_nodes_paths_are_judged_alike_under_node_and_volume_nodes(tmp_path: Path) -> None:
    """node.workdir/python and each volume.nodes[i]'s: one warning each when they name a
    path of one machine (the volume's node home workdir was an error, the pilot's nothing),
    and volume.inputs.on_nodes, absolute by design, no finding (issue 37)."""
    root = good_project(tmp_path)
    node = {"kind": "ssh", "host": "gpu-a", "workdir": "/home/ubuntu/w",
            "python": "/opt/conda/bin/python"}
    (root / "pilot.yaml").write_text(dump(merged(
        node=node, volume={"inputs": {"dir": "data/volume", "on_nodes": "/data/corpus",
                                      "expected_count": 10},
                           "nodes": [node, {**node, "host": "gpu-b", "workdir": "/ws"}]})))
    problems = [p for p in check_project(root) if p.file and p.file.endswith("pilot.yaml")]
    assert {(p.loc, p.severity) for p in problems} == {
        (f"{where}.{field}", "warning") for field in ("workdir", "python")
        for where in ("node", "volume.nodes[0]", "volume.nodes[1]")}
    assert all("a path of one machine" in p.message for p in problems)


def test_precheck_passes_the_demo_and_stops_a_home_path(tmp_path: Path) -> None:
    assert precheck_manifest(load_manifest_file(REPO / "manifests" / "pilote.yaml")) == []
    make_project(tmp_path)
    path = tmp_path / "m.yaml"
    path.write_text(dump(merged(task={"params": {"weights": "~/w.bin"}})))
    with pytest.raises(ProjectCheckError) as info:
        precheck_manifest(load_manifest_file(path))
    assert info.value.problems[0].loc == "task.params.weights"


def test_git_commit_is_read_from_the_checkout_without_git(tmp_path: Path) -> None:
    from bot.manifest.project_check import git_commit

    assert git_commit(tmp_path) is None  # not a git checkout
    git = tmp_path / ".git"
    (git / "refs" / "heads").mkdir(parents=True)
    (git / "HEAD").write_text("ref: refs/heads/main\n")
    (git / "refs" / "heads" / "main").write_text("a" * 40 + "\n")
    (tmp_path / "src").mkdir()
    assert git_commit(tmp_path / "src") == "a" * 40  # found from a folder inside
    (git / "refs" / "heads" / "main").unlink()
    (git / "packed-refs").write_text(f"# pack-refs\n{'b' * 40} refs/heads/main\n")
    assert git_commit(tmp_path) == "b" * 40


def test_the_manifest_s_paths_win_over_the_guide_s_layout(tmp_path: Path) -> None:
    root = good_project(tmp_path)
    (root / "data" / "pilote").rename(root / "data" / "pilot")
    (root / "requirements-rebuild.txt").rename(root / "requirements.txt")
    manifest = root / "manifests" / "sentiment.yaml"
    manifest.parent.mkdir()
    manifest.write_text(dump(merged(project={"dir": "..", "requirements": "requirements.txt"},
                                    inputs={"dir": "data/pilot"})))
    (root / "pilot.yaml").unlink()
    assert check_project(root, manifests=[manifest]) == []
    without = {p.loc for p in check_project(root)}  # the guide's layout is the default
    assert {"data/pilote", "requirements-rebuild.txt"} <= without
    (root / "data" / "pilot").rename(root / "data" / "pilto")
    [missing] = [p for p in check_project(root, manifests=[manifest]) if p.severity == "error"]
    assert missing.loc == "inputs.dir data/pilot (sentiment.yaml)" and "missing" in missing.message
