"""Requirement files and version matching, written for a bare node.

The runner must check ``requirements-rebuild.txt`` on a node that may not have the
``packaging`` library, so this module carries a PEP 440 subset: versions with epoch,
release, pre/post/dev and local parts; specifiers ``== != <= >= < > ~= ===`` and ``==X.*``;
requirement lines with extras, environment markers (the common variables), ``-r`` includes
and pip options (ignored). When ``packaging`` is importable it is used for the match, so
the answer is the one pip would give; ``matcher`` in the report says which one decided.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

_VERSION_RE = re.compile(
    r"""^\s*v?
    (?:(?P<epoch>\d+)!)?
    (?P<release>\d+(?:\.\d+)*)
    (?:[-_.]?(?P<pre_l>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d+)?)?
    (?:(?:-(?P<post_n1>\d+))|(?:[-_.]?(?P<post_l>post|rev|r)[-_.]?(?P<post_n2>\d+)?))?
    (?:[-_.]?(?P<dev_l>dev)[-_.]?(?P<dev_n>\d+)?)?
    (?:\+(?P<local>[a-z0-9]+(?:[-_.][a-z0-9]+)*))?
    \s*$""",
    re.VERBOSE | re.IGNORECASE,
)

_PRE_NORM = {"a": "a", "alpha": "a", "b": "b", "beta": "b", "c": "rc", "rc": "rc",
             "pre": "rc", "preview": "rc"}
_PRE_ORDER = {"a": 0, "b": 1, "rc": 2}


class VersionError(ValueError):
    """A version or specifier that this module cannot read."""


@dataclass(frozen=True)
class Version:
    epoch: int
    release: Tuple[int, ...]
    pre: Optional[Tuple[str, int]]
    post: Optional[int]
    dev: Optional[int]
    local: Optional[str]

    @property
    def is_prerelease(self) -> bool:
        return self.pre is not None or self.dev is not None

    @property
    def public(self) -> Version:
        return Version(self.epoch, self.release, self.pre, self.post, self.dev, None)

    def key(self) -> Tuple[Any, ...]:
        """A sort key equivalent to PEP 440 ordering (the one packaging uses)."""
        release = list(self.release)
        while len(release) > 1 and release[-1] == 0:
            release.pop()
        if self.pre is None and self.post is None and self.dev is not None:
            pre: Tuple[int, int] = (-1, 0)  # 1.0.dev0 sorts before 1.0a0
        elif self.pre is None:
            pre = (3, 0)
        else:
            pre = (_PRE_ORDER[self.pre[0]], self.pre[1])
        post = -1 if self.post is None else self.post
        dev = (1, 0) if self.dev is None else (0, self.dev)
        local: Tuple[Any, ...] = (0, ())
        if self.local is not None:
            local = (1, tuple((1, int(p), "") if p.isdigit() else (0, 0, p)
                              for p in re.split(r"[-_.]", self.local.lower())))
        return (self.epoch, tuple(release), pre, post, dev, local)

    def __lt__(self, other: Version) -> bool:
        return self.key() < other.key()

    def __le__(self, other: Version) -> bool:
        return self.key() <= other.key()

    def __gt__(self, other: Version) -> bool:
        return self.key() > other.key()

    def __ge__(self, other: Version) -> bool:
        return self.key() >= other.key()

    def same(self, other: Version) -> bool:
        return self.key() == other.key()


def parse_version(text: str) -> Version:
    m = _VERSION_RE.match(text)
    if not m:
        raise VersionError(f"not a PEP 440 version: {text!r}")
    pre = None
    if m.group("pre_l"):
        pre = (_PRE_NORM[m.group("pre_l").lower()], int(m.group("pre_n") or 0))
    post = None
    if m.group("post_n1"):
        post = int(m.group("post_n1"))
    elif m.group("post_l"):
        post = int(m.group("post_n2") or 0)
    dev = int(m.group("dev_n") or 0) if m.group("dev_l") else None
    return Version(
        epoch=int(m.group("epoch") or 0),
        release=tuple(int(p) for p in m.group("release").split(".")),
        pre=pre, post=post, dev=dev,
        local=m.group("local").lower() if m.group("local") else None,
    )


_SPEC_RE = re.compile(r"^\s*(===|==|!=|~=|<=|>=|<|>)\s*([^\s,;]+)\s*$")


def _prefix_match(version: Version, prefix_text: str) -> bool:
    prefix = parse_version(prefix_text)
    n = len(prefix.release)
    release = tuple((list(version.release) + [0] * n)[:n])
    if version.epoch != prefix.epoch or release != prefix.release:
        return False
    for attr in ("pre", "post", "dev"):
        wanted = getattr(prefix, attr)
        if wanted is not None and getattr(version, attr) != wanted:
            return False
    return True


def _same_base(a: Version, b: Version) -> bool:
    return a.epoch == b.epoch and _trim(a.release) == _trim(b.release)


def match_one(version: Version, op: str, target: str) -> bool:
    """Does ``version`` satisfy one clause ``op target``? (``===`` needs the text: see
    :func:`match_one_text`.)"""
    if op == "===":
        raise VersionError("=== compares version strings; use match_one_text")
    if target.endswith(".*"):
        if op not in ("==", "!="):
            raise VersionError(f"wildcard only allowed with == and !=: {op}{target}")
        hit = _prefix_match(version, target[:-2])
        return hit if op == "==" else not hit
    want = parse_version(target)
    if op in ("==", "!="):
        mine = version if want.local is not None else version.public
        return mine.same(want) if op == "==" else not mine.same(want)
    if want.local is not None:
        raise VersionError(f"a local version is only allowed with == and !=: {op}{target}")
    if op == "~=":
        if len(want.release) < 2:
            raise VersionError(f"~= needs at least two release parts: ~={target}")
        prefix = ".".join(str(p) for p in want.release[:-1])
        if want.epoch:
            prefix = f"{want.epoch}!{prefix}"
        return version.public >= want and _prefix_match(version, prefix)
    if op == ">=":
        return version.public >= want
    if op == "<=":
        return version.public <= want
    if op == "<":
        # PEP 440: <V excludes V's own pre-releases unless V itself is a pre/dev/post.
        if not version.public < want:
            return False
        special = want.pre is not None or want.dev is not None or want.post is not None
        return special or not _same_base(version, want)
    if op == ">":
        # PEP 440: >V excludes V's post-releases (same pre segment); locals are ignored.
        if not version.public > want:
            return False
        return not (_same_base(version, want) and want.dev is None and want.post is None
                    and version.pre == want.pre and version.post is not None)
    raise VersionError(f"unknown operator {op!r}")


def _trim(release: Tuple[int, ...]) -> Tuple[int, ...]:
    parts = list(release)
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def parse_specifier(text: str) -> List[Tuple[str, str]]:
    """"">=1.2, <2" -> [(">=", "1.2"), ("<", "2")]; an empty string means any version."""
    clauses: List[Tuple[str, str]] = []
    for part in text.split(","):
        if not part.strip():
            continue
        m = _SPEC_RE.match(part)
        if not m:
            raise VersionError(f"not a version specifier: {part.strip()!r}")
        clauses.append((m.group(1), m.group(2)))
    return clauses


def satisfies_builtin(version_text: str, specifier: str) -> bool:
    """The built-in match: every clause holds (pre-releases are accepted, as pip does
    for an installed version)."""
    clauses = parse_specifier(specifier)
    if any(op == "===" for op, _ in clauses):
        return all(match_one_text(version_text, op, t) for op, t in clauses)
    version = parse_version(version_text)
    return all(match_one(version, op, target) for op, target in clauses)


def match_one_text(version_text: str, op: str, target: str) -> bool:
    if op == "===":
        return version_text.strip() == target
    return match_one(parse_version(version_text), op, target)


def satisfies(version_text: str, specifier: str) -> Tuple[bool, str]:
    """Match with ``packaging`` when importable, else the built-in matcher.

    Returns (ok, matcher name).
    """
    try:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet
        from packaging.version import InvalidVersion
        from packaging.version import Version as PVersion
    except ImportError:
        return satisfies_builtin(version_text, specifier), "builtin"
    try:
        return SpecifierSet(specifier).contains(PVersion(version_text),
                                                prereleases=True), "packaging"
    except (InvalidSpecifier, InvalidVersion):
        return satisfies_builtin(version_text, specifier), "builtin"


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


def read_requirements(path: str, _seen: Optional[List[str]] = None) -> Tuple[
        List[Requirement], List[Dict[str, str]]]:
    """Requirements of a file (following ``-r``), and the lines that could not be read."""
    seen = _seen if _seen is not None else []
    real = os.path.realpath(path)
    if real in seen:
        return [], []
    seen.append(real)
    reqs: List[Requirement] = []
    problems: List[Dict[str, str]] = []
    with open(path, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    for lineno, raw in enumerate(lines, 1):
        line = re.sub(r"(^|\s)#.*$", "", raw).strip()
        where = f"{path}:{lineno}"
        if not line:
            continue
        if line.startswith(("-r ", "--requirement")):
            target = line.split(None, 1)[1] if " " in line else line.split("=", 1)[-1]
            inc = os.path.join(os.path.dirname(path), target.strip())
            try:
                sub, subprob = read_requirements(inc, seen)
            except OSError as exc:
                problems.append({"where": where, "line": raw.strip(),
                                 "problem": f"cannot read {inc}: {exc.strerror or exc}"})
                continue
            reqs.extend(sub)
            problems.extend(subprob)
            continue
        if line.startswith("-"):
            continue  # pip options (-e, --index-url, -c ...) do not name an installed package
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
    skipped_by_marker: List[str] = field(default_factory=list)
    matcher: str = "builtin"

    @property
    def ok(self) -> bool:
        return not (self.missing or self.mismatched or self.unreadable)

    def to_dict(self) -> Dict[str, Any]:
        return {"checked": self.checked, "ok": self.ok, "matcher": self.matcher,
                "satisfied": len(self.satisfied), "missing": self.missing,
                "mismatched": self.mismatched, "unreadable": self.unreadable,
                "skipped_by_marker": self.skipped_by_marker}


def check_requirements(path: str, installed: Optional[Dict[str, str]] = None
                       ) -> RequirementsReport:
    """Check every requirement of ``path``; all problems are listed, not just the first."""
    reqs, problems = read_requirements(path)
    have = installed if installed is not None else installed_versions()
    report = RequirementsReport(unreadable=problems)
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
