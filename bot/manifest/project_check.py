"""Check a project directory the way the guide prescribes, before a paid hour is spent.

A project must survive a change of machine: a README, pinned requirements, parameter
files without secrets, the pilot inputs, the code, a place for runs; and no path that only
exists on one machine (absolute, home directory) or that leaves the project (``..``).
Every finding names the file, the line where there is one, and what to do.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path, PurePosixPath, PureWindowsPath
from typing import Any

from bot.errors import Problem, ProjectCheckError
from bot.manifest.git_head import git_commit as git_commit  # re-exported for the service
from bot.manifest.load import LoadedManifest
from bot.manifest.secrets import find_secrets
from bot.manifest.source import (
    DOCUMENT,
    MAX_BYTES,
    FieldPath,
    SourceError,
    SourceMap,
    format_loc,
    parse_text,
)

_HOME = re.compile(r"^(?:~(?:[/\\]|$)|/home/|/Users/|/root(?:/|$)|[A-Za-z]:[\\/]Users[\\/])")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_VCS = re.compile(r"^(?:git|hg|svn|bzr)\+[A-Za-z]+://")
_REQUIREMENT = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:\[[^\]]*\])?\s*"
                          r"(?P<rest>[^;]*)(?:;.*)?$")
_SPECIFIER = re.compile(r"^\s*(?:===|==|!=|~=|>=|<=|>|<)\s*\d[A-Za-z0-9.*+!_-]*\s*$")
# Manifest fields whose value is a path relative to project.dir; (field, escape is an error)
_PROJECT_PATHS: tuple[tuple[FieldPath, bool], ...] = (
    (("inputs", "dir"), True), (("project", "requirements"), True),
    (("volume", "inputs", "dir"), True), (("results", "runs_dir"), False),
    (("results", "copy_to"), False),
)
_VALUE_FILE_MAX_BYTES = 16 * 1024 * 1024
# The node's own paths are explicit parameters of that node, not assumptions about the bot
# host: the same rule for `node` and for each of `volume.nodes` (one was checked as a
# project path, the other not at all); `volume.inputs.on_nodes` is absolute by design.
_NODE_PATH_FIELDS = ("workdir", "python")
_ON_NODES = ("volume", "inputs", "on_nodes")


def check_project(directory: Path | str, *, manifests: list[Path] | None = None) -> list[Problem]:
    """Every finding (errors and warnings) for the project at ``directory``."""
    root = Path(directory)
    if not root.is_dir():
        return [Problem("project", f"{root} is not a directory", file=str(root))]
    inputs, requirements = _layout_of(root, manifests or [])
    problems = list(_check_layout(root, inputs, requirements))
    for _, path in requirements:
        problems += _check_requirements(path)
    problems += _check_configs(root)
    found = sorted({*root.glob("*.y*ml"), *root.glob("manifests/*.y*ml"), *(manifests or [])})
    for manifest in found:
        problems += _check_value_file(manifest, manifest_paths=True)
    return problems


def precheck_manifest(loaded: LoadedManifest) -> list[Problem]:
    """The checks that stop ``preflight run`` before dispatch; returns the warnings.

    Raises ProjectCheckError when the manifest's values or the project's parameter files
    hold a machine-specific path, an escape from the project, or a secret.
    """
    problems = _scan_data(loaded.data, loaded.marks, loaded.source,  # parsed when loaded
                          manifest_paths=True)
    config = loaded.project_dir / "config"
    if config.is_dir():
        problems += _check_configs(loaded.project_dir)
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ProjectCheckError(errors)
    return [p for p in problems if p.severity != "error"]


Located = list[tuple[str, Path]]  # (what the finding is named, the path checked)


def _layout_of(root: Path, manifests: list[Path]) -> tuple[Located, Located]:
    """The pilot inputs folders and requirements files to check: those the given manifests
    name (``inputs.dir``, ``project.requirements``, relative to their ``project.dir``),
    else the guide's layout (``data/pilote``, ``requirements-rebuild.txt``)."""
    inputs: Located = []
    requirements: Located = []
    for manifest in manifests:
        try:
            data, _ = parse_text(manifest.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, SourceError):
            continue  # _check_value_file reports an unreadable manifest
        if not isinstance(data, dict):
            continue
        project = _mapping(data.get("project"))
        section = _mapping(data.get("inputs"))
        base = manifest.parent / str(project.get("dir") or ".")
        if isinstance(section.get("dir"), str):
            inputs.append((f"inputs.dir {section['dir']} ({manifest.name})",
                           base / section["dir"]))
        if isinstance(project.get("requirements"), str):
            requirements.append((f"project.requirements {project['requirements']} "
                                 f"({manifest.name})", base / project["requirements"]))
    return (inputs or [("data/pilote", root / "data" / "pilote")],
            requirements or [("requirements-rebuild.txt", root / "requirements-rebuild.txt")])


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _check_layout(root: Path, inputs: Located, requirements: Located) -> Iterator[Problem]:
    name = str(root)
    if not (root / "README.md").is_file():
        yield Problem("README.md", "missing: say what the project does, the entry command "
                      "and how to rebuild its environment", file=name)
    for label, path in requirements:
        if not path.is_file():
            yield Problem(label, "missing: list every dependency, pinned (name==X.Y) or "
                          "ranged, so another machine rebuilds the same environment", file=name)
    for label, data in inputs:
        if not data.is_dir():
            yield Problem(label, "missing: keep the pilot inputs in the project, "
                          "immutable, one file per input", file=name)
        elif not any(p.is_file() for p in data.iterdir()):
            yield Problem(label, "empty: put the pilot inputs here", file=name)
    for folder, why in (("src", "the code the pilot runs"),
                        ("config", "parameter files such as config/pilote.json (no secrets)"),
                        ("runs", "one subfolder per test; Preflight creates it if absent")):
        if not (root / folder).is_dir():
            yield Problem(f"{folder}/", f"missing: {why}", file=name, severity="warning")


def _check_requirements(path: Path) -> list[Problem]:
    if not path.is_file():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(path.name, f"unreadable: {exc}", file=str(path))]
    problems: list[Problem] = []
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#") or line.startswith("-"):
            continue
        message = _requirement_problem(line)
        if message is not None:
            problems.append(Problem(path.name, message, lineno, 1, file=str(path)))
    for finding in find_secrets(text.splitlines()):
        problems.append(Problem(path.name, finding.message, int(finding.path[0]) + 1, 1,
                                file=str(path)))
    return problems


def _requirement_problem(line: str) -> str | None:
    if _VCS.match(line):
        rest = line.split("://", 1)[1].split("#", 1)[0]
        if "@" in rest.partition("/")[2]:
            return None  # pinned to a commit or tag
        return (f"{line!r} follows a moving branch: pin it to a commit or tag "
                "(git+https://host/org/repo.git@<commit>#egg=name)")
    if _URL.match(line) or line.startswith((".", "/")):
        return None  # a direct URL or file (wheel, archive) pins by itself
    match = _REQUIREMENT.match(line)
    if match is None:
        return f"cannot read requirement {line!r}: expected name==version or name>=x,<y"
    rest = match["rest"].strip()
    if rest.startswith("@"):
        return None  # a direct reference (URL or path) pins by itself
    if not rest:
        return (f"{match['name']} is not pinned: write {match['name']}==X.Y (or a range), "
                "so another machine installs the same thing")
    if not all(_SPECIFIER.match(part) for part in rest.split(",")):
        return f"cannot read the version specifier {rest!r} of {match['name']}"
    return None


def _check_configs(root: Path) -> list[Problem]:
    problems: list[Problem] = []
    for path in sorted((root / "config").glob("*.json")):
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            problems.append(Problem(path.name, f"unreadable: {exc}", file=str(path)))
            continue
        except json.JSONDecodeError as exc:
            problems.append(Problem(DOCUMENT, f"not valid JSON: {exc.msg}", exc.lineno,
                                    exc.colno, file=str(path)))
            continue
        problems += _check_value_file(path, manifest_paths=False)
    return problems


def _check_value_file(path: Path, *, manifest_paths: bool) -> list[Problem]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        return [Problem(path.name, f"unreadable: {exc}", file=str(path))]
    if manifest_paths:
        return _scan_manifest_text(text, str(path))
    return _scan_values(text, str(path), manifest_paths=False)


def _scan_manifest_text(text: str, source: str) -> list[Problem]:
    return _scan_values(text, source, manifest_paths=True)


def _scan_values(text: str, source: str, *, manifest_paths: bool) -> list[Problem]:
    try:  # a parameter file may be larger than a manifest; its aliases are capped alike
        data, source_map = parse_text(text, max_bytes=MAX_BYTES if manifest_paths
                                      else _VALUE_FILE_MAX_BYTES)
    except SourceError as exc:
        return [Problem(p.loc, p.message, p.line, p.column, file=source) for p in exc.problems]
    return _scan_data(data, source_map, source, manifest_paths=manifest_paths)


def _scan_data(data: Any, source_map: SourceMap, source: str, *,
               manifest_paths: bool) -> list[Problem]:
    problems: list[Problem] = []
    for finding in find_secrets(data):
        problems.append(_at(source_map, finding.path, finding.message, source))
    relative_fields = dict(_PROJECT_PATHS) if manifest_paths else {}
    for path, value in _strings(data, ()):
        if manifest_paths and (_node_side(path) or path == _ON_NODES):
            problems += _node_path(source_map, path, value, source)
            continue
        if path in relative_fields:
            problems += _relative_field(source_map, path, value, relative_fields[path], source)
        else:
            problems += _value_paths(source_map, path, value, source)
    return problems


def _node_side(path: FieldPath) -> bool:
    """A field of ``node`` or of one of ``volume.nodes``."""
    return path[:1] == ("node",) or (path[:2] == ("volume", "nodes") and len(path) > 3)


def _node_path(source_map: SourceMap, path: FieldPath, value: str,
               source: str) -> list[Problem]:
    """A node's workdir or python given as a path of one machine: a warning, the same for
    `node` and each of `volume.nodes` (it holds only on a node that has it)."""
    if path[-1] not in _NODE_PATH_FIELDS or not (_HOME.match(value) or _is_absolute(value)):
        return []
    return [_at(source_map, path, f"{value!r} is a path of one machine ({path[-1]} on the "
                "node): it holds only where it exists; the manifest needs it changed for "
                "another node", source, severity="warning")]


def _relative_field(source_map: SourceMap, path: FieldPath, value: str, strict: bool,
                    source: str) -> list[Problem]:
    if _URL.match(value):
        return []
    if _HOME.match(value):
        return [_at(source_map, path, f"{value!r} is a home-directory path: it exists on one "
                    "machine only; use a path relative to project.dir", source)]
    if _is_absolute(value):
        return [] if not strict else [_at(
            source_map, path, f"{value!r} is absolute: use a path relative to project.dir",
            source, severity="warning")]
    if _escapes(value):
        return [_at(source_map, path, f"{value!r} leaves the project ('..'): keep it inside "
                    "project.dir so the project moves as one directory", source,
                    severity="error" if strict else "warning")]
    return []


def _value_paths(source_map: SourceMap, path: FieldPath, value: str,
                 source: str) -> list[Problem]:
    problems: list[Problem] = []
    for token in value.split():
        token = token.strip("\"'=,")
        if _URL.match(token):
            continue
        if _HOME.match(token):
            problems.append(_at(source_map, path, f"{token!r} is a home-directory path: a path "
                                "into a home directory is not a transfer procedure; make it a "
                                "parameter relative to the project", source))
        elif _is_absolute(token):
            problems.append(_at(source_map, path, f"{token!r} is absolute: prefer a path "
                                "relative to the project, or a parameter the node sets",
                                source, severity="warning"))
        elif "/" in token and _escapes(token):
            problems.append(_at(source_map, path, f"{token!r} leaves the project ('..'): "
                                "move what it points to into the project, or make it a "
                                "parameter the node sets", source, severity="warning"))
    return problems


def _is_absolute(value: str) -> bool:
    return value.startswith("/") or PureWindowsPath(value).is_absolute()


def _escapes(value: str) -> bool:
    depth = 0
    for part in PurePosixPath(value.replace("\\", "/")).parts:
        depth += -1 if part == ".." else (0 if part == "." else 1)
        if depth < 0:
            return True
    return False


def _strings(data: Any, path: FieldPath) -> Iterator[tuple[FieldPath, str]]:
    if isinstance(data, dict):
        for key, value in data.items():
            yield from _strings(value, (*path, str(key)))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield from _strings(value, (*path, index))
    elif isinstance(data, str):
        yield path, data


def _at(source_map: SourceMap, path: FieldPath, message: str, source: str, *,
        severity: str = "error") -> Problem:
    line, column = source_map.locate(path)
    return Problem(format_loc(path) or "(document)", message, line, column, file=source,
                   severity=severity)


def raise_on_errors(problems: list[Problem]) -> None:
    """ProjectCheckError listing the errors, when there are any."""
    errors = [p for p in problems if p.severity == "error"]
    if errors:
        raise ProjectCheckError(errors)

