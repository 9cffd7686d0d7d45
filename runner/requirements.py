"""Requirement files, written for a bare node.

The runner must check ``requirements-rebuild.txt`` on a node that may not have the
``packaging`` library: requirement lines with extras, environment markers (the common
variables), ``-r`` includes, ``\\`` line continuations and pip options (ignored, also
per-line ones such as ``--hash``). Versions are matched by :mod:`runner.versions` (a
PEP 440 subset, or ``packaging`` when it is importable; ``matcher`` in the report says
which one decided).
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from runner.spec import RunSpec
from runner.stage import StageFailure
from runner.versions import (  # re-exported: the matching API lives there
    Version,
    VersionError,
    match_one,
    match_one_text,
    parse_specifier,
    parse_version,
    satisfies,
    satisfies_builtin,
)

# ---------------------------------------------------------------- requirement lines

_NAME_RE = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(\[[^\]]*\])?\s*(.*)$")


def normalize_name(name: str) -> str:
    """PEP 503 normalized project name."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class Requirement:
    name: str
    specifier: str
    marker: Optional[str]
    url: Optional[str]
    source: str  # "file:line"
    line: str


def marker_environment() -> Dict[str, str]:
    return {
        "python_version": f"{sys.version_info[0]}.{sys.version_info[1]}",
        "python_full_version": platform.python_version(),
        "sys_platform": sys.platform,
        "platform_system": platform.system(),
        "platform_machine": platform.machine(),
        "platform_release": platform.release(),
        "os_name": os.name,
        "implementation_name": sys.implementation.name,
        "platform_python_implementation": platform.python_implementation(),
        "extra": "",
    }


_MARKER_ATOM = re.compile(
    r"""^\s*(?P<l>[A-Za-z_]+|'[^']*'|"[^"]*")\s*
    (?P<op>===|==|!=|<=|>=|<|>|~=|not\s+in|in)\s*
    (?P<r>[A-Za-z_]+|'[^']*'|"[^"]*")\s*$""",
    re.VERBOSE,
)


def evaluate_marker(marker: str, env: Optional[Dict[str, str]] = None) -> bool:
    """Evaluate an environment marker (``and``/``or``/parentheses, common variables)."""
    env = env or marker_environment()
    text = marker.strip()
    depth, splits_or, splits_and = 0, [], []
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and re.match(r"\sor\s", text[i:i + 4]):
            splits_or.append(i)
        if depth == 0 and re.match(r"\sand\s", text[i:i + 5]):
            splits_and.append(i)
    if splits_or:
        parts = _split_at(text, splits_or, 4)
        return any(evaluate_marker(p, env) for p in parts)
    if splits_and:
        parts = _split_at(text, splits_and, 5)
        return all(evaluate_marker(p, env) for p in parts)
    if text.startswith("(") and text.endswith(")"):
        return evaluate_marker(text[1:-1], env)
    m = _MARKER_ATOM.match(text)
    if not m:
        raise VersionError(f"cannot read marker {marker!r}")
    left, right = _marker_value(m.group("l"), env), _marker_value(m.group("r"), env)
    op = re.sub(r"\s+", " ", m.group("op"))
    if op == "in":
        return left in right
    if op == "not in":
        return left not in right
    try:
        return match_one_text(left, op, right)
    except VersionError:
        if op == "==":
            return left == right
        if op == "!=":
            return left != right
        raise


def _split_at(text: str, positions: List[int], width: int) -> List[str]:
    parts, start = [], 0
    for pos in positions:
        parts.append(text[start:pos])
        start = pos + width
    parts.append(text[start:])
    return parts


def _marker_value(token: str, env: Dict[str, str]) -> str:
    if token[0] in "'\"":
        return token[1:-1]
    if token not in env:
        raise VersionError(f"unknown marker variable {token!r}")
    return env[token]


def parse_requirement(line: str, source: str) -> Requirement:
    text = line.strip()
    marker = None
    if ";" in text:
        text, marker = (p.strip() for p in text.split(";", 1))
    m = _NAME_RE.match(text)
    if not m:
        raise VersionError(f"{source}: cannot read requirement {line.strip()!r}")
    name, rest = m.group(1), m.group(3).strip()
    url = None
    if rest.startswith("@"):
        url, rest = rest[1:].strip(), ""
    if rest.startswith("(") and rest.endswith(")"):
        rest = rest[1:-1]
    parse_specifier(rest)  # validates; raises VersionError naming the clause
    return Requirement(name, rest.replace(" ", ""), marker, url, source, line.strip())


def logical_lines(text: str) -> List[Tuple[int, str]]:
    """(first line number, text) of each logical line: ``\\`` continuations joined, as pip
    does (pip-compile ``--generate-hashes`` output puts each ``--hash`` on its own line)."""
    out: List[Tuple[int, str]] = []
    parts: List[str] = []
    start = 0
    for lineno, raw in enumerate(text.splitlines(), 1):
        if not parts:
            start = lineno
        if raw.rstrip().endswith("\\"):
            parts.append(raw.rstrip()[:-1])
            continue
        parts.append(raw)
        out.append((start, " ".join(parts)))
        parts = []
    if parts:
        out.append((start, " ".join(parts)))
    return out


_OPTION_RE = re.compile(r"\s--[A-Za-z]")  # per-requirement pip options: --hash=..., ...
_WHEEL_RE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._]*)-([^-]+)-.*\.whl$")


def _nameless(line: str, where: str) -> Any:
    """A URL or path without ``name @``: a Requirement when its name can be told (a wheel
    file name, ``#egg=name``), else an ``unchecked`` entry (pip could install it, we cannot
    tell which distribution it is)."""
    egg = re.search(r"#egg=([A-Za-z0-9][A-Za-z0-9._-]*)", line)
    from urllib.parse import unquote

    base = unquote(os.path.basename(line.split("#", 1)[0].split("?", 1)[0]))
    wheel = _WHEEL_RE.match(base)
    if wheel:
        return Requirement(wheel.group(1), f"=={wheel.group(2)}", None, line, where, line)
    if egg:
        return Requirement(egg.group(1), "", None, line, where, line)
    return {"where": where, "line": line, "kind": "unchecked",
            "problem": "a URL or path without a package name: not checked"}


def _looks_like_location(line: str) -> bool:
    return ("://" in line.split("@", 1)[0] or line.startswith((".", "/", "~"))
            or line.endswith((".whl", ".zip", ".tar.gz")) and "@" not in line)


def read_requirements(path: str, _seen: Optional[List[str]] = None) -> Tuple[
        List[Requirement], List[Dict[str, str]]]:
    """Requirements of a file (following ``-r``), and the lines that could not be read
    (or, with ``"kind": "unchecked"``, a URL or path whose package cannot be told)."""
    seen = _seen if _seen is not None else []
    real = os.path.realpath(path)
    if real in seen:
        return [], []
    seen.append(real)
    reqs: List[Requirement] = []
    problems: List[Dict[str, str]] = []
    with open(path, encoding="utf-8-sig") as fh:  # -sig: a BOM from a Windows editor
        text = fh.read()
    for lineno, raw in logical_lines(text):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        where = f"{path}:{lineno}"
        if not line:
            continue
        if line.startswith(("-r ", "--requirement")):
            target = line.split(None, 1)[1] if " " in line else line.split("=", 1)[-1]
            inc = os.path.join(os.path.dirname(path), target.strip())
            try:
                sub, subprob = read_requirements(inc, seen)
            except (OSError, UnicodeDecodeError) as exc:
                why = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                problems.append({"where": where, "line": raw.strip(),
                                 "problem": f"cannot read {inc}: {why}"})
                continue
            reqs.extend(sub)
            problems.extend(subprob)
            continue
        if line.startswith("-"):
            continue  # pip options (-e, --index-url, -c ...) do not name an installed package
        line = _OPTION_RE.split(f" {line}", 1)[0].strip()
        if _looks_like_location(line):
            found = _nameless(line, where)
            (reqs if isinstance(found, Requirement) else problems).append(found)
            continue
        try:
            reqs.append(parse_requirement(line, where))
        except VersionError as exc:
            problems.append({"where": where, "line": raw.strip(), "problem": str(exc)})
    return reqs, problems


# ---------------------------------------------------------------- installed packages

def installed_versions() -> Dict[str, str]:
    """Normalized name -> version of every distribution this interpreter can import."""
    from importlib import metadata

    found: Dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"] if dist.metadata else None
        if name and normalize_name(name) not in found:
            found[normalize_name(name)] = dist.version
    return found


@dataclass
class RequirementsReport:
    checked: int = 0
    satisfied: List[Dict[str, str]] = field(default_factory=list)
    missing: List[Dict[str, str]] = field(default_factory=list)
    mismatched: List[Dict[str, str]] = field(default_factory=list)
    unreadable: List[Dict[str, str]] = field(default_factory=list)
    unchecked: List[Dict[str, str]] = field(default_factory=list)
    skipped_by_marker: List[str] = field(default_factory=list)
    matcher: str = "builtin"

    @property
    def ok(self) -> bool:
        return not (self.missing or self.mismatched or self.unreadable)

    def to_dict(self) -> Dict[str, Any]:
        return {"checked": self.checked, "ok": self.ok, "matcher": self.matcher,
                "satisfied": len(self.satisfied), "missing": self.missing,
                "mismatched": self.mismatched, "unreadable": self.unreadable,
                "unchecked": self.unchecked,
                "skipped_by_marker": self.skipped_by_marker}


def check_requirements(path: str, installed: Optional[Dict[str, str]] = None
                       ) -> RequirementsReport:
    """Check every requirement of ``path``; all problems are listed, not just the first."""
    reqs, problems = read_requirements(path)
    have = installed if installed is not None else installed_versions()
    report = RequirementsReport(
        unreadable=[p for p in problems if p.get("kind") != "unchecked"],
        unchecked=[p for p in problems if p.get("kind") == "unchecked"])
    for req in reqs:
        if req.marker:
            try:
                applies = evaluate_marker(req.marker)
            except VersionError as exc:
                report.unreadable.append({"where": req.source, "line": req.line,
                                          "problem": str(exc)})
                continue
            if not applies:
                report.skipped_by_marker.append(req.name)
                continue
        report.checked += 1
        version = have.get(normalize_name(req.name))
        entry = {"name": req.name, "wanted": req.specifier or "any", "where": req.source}
        if version is None:
            report.missing.append(entry)
            continue
        entry["installed"] = version
        if not req.specifier:
            report.satisfied.append(entry)
            continue
        try:
            ok, report.matcher = satisfies(version, req.specifier)
        except VersionError as exc:
            report.unreadable.append({"where": req.source, "line": req.line,
                                      "problem": str(exc)})
            continue
        (report.satisfied if ok else report.mismatched).append(entry)
    return report


__all__ = [
    "Version", "VersionError", "match_one", "match_one_text", "parse_specifier",
    "parse_version", "satisfies", "satisfies_builtin", "normalize_name", "Requirement",
    "marker_environment", "evaluate_marker", "parse_requirement", "logical_lines",
    "read_requirements", "installed_versions", "RequirementsReport", "check_requirements",
    "check_project_requirements", "requirements_path",
]


# ---------------------------------------------------------------- the project's file

def check_project_requirements(spec: RunSpec) -> Dict[str, Any]:
    """The ``environment`` stage's check (also the Blender preparation's): every requirement
    of the project's requirements file is installed at a good version, else a
    ``StageFailure`` of the ``environment`` stage naming what is missing or wrong."""
    path = requirements_path(spec)
    if path is None:
        return {"requirements": None, "note": "no requirements file in the manifest"}
    if not os.path.isfile(path):
        raise StageFailure("environment", f"requirements file {path} does not exist",
                           facts={"requirements": path}, error_type="FileNotFoundError",
                           hint="check project.dir and project.requirements (paths are "
                                "relative to the project directory)")
    try:
        report = check_requirements(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise StageFailure("environment", f"cannot read {path}: {exc}",
                           facts={"requirements": path}) from exc
    facts = {"requirements": path, **report.to_dict()}
    if not report.ok:
        raise StageFailure("environment", _describe_problems(report.to_dict()), facts=facts,
                           error_type="RequirementsNotMet",
                           hint="install the listed packages into the interpreter your "
                                "project runs with (node.python; this run used "
                                f"{sys.executable}), e.g. `<node.python> -m pip install -r "
                                f"{path}`; never into Preflight's own environment")
    return facts


def requirements_path(spec: RunSpec) -> Optional[str]:
    req = spec.project.requirements
    if not req:
        return None
    if os.path.isabs(req):
        return req
    return os.path.abspath(os.path.join(spec.project.dir or ".", req))


def _describe_problems(report: Dict[str, Any]) -> str:
    parts: List[str] = []
    if report["missing"]:
        parts.append("missing: " + ", ".join(f"{m['name']} ({m['wanted']})"
                                             for m in report["missing"]))
    if report["mismatched"]:
        parts.append("wrong version: " + ", ".join(
            f"{m['name']} {m['installed']} (wants {m['wanted']})" for m in report["mismatched"]))
    if report["unreadable"]:
        parts.append("unreadable lines: " + ", ".join(u["where"] for u in report["unreadable"]))
    return "requirements not met: " + "; ".join(parts)
