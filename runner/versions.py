"""PEP 440 versions and specifiers, written for a bare node (no ``packaging`` needed).

Versions with epoch, release, pre/post/dev and local parts; specifiers
``== != <= >= < > ~= ===`` and ``==X.*``. When ``packaging`` is importable,
:func:`satisfies` uses it, so the answer is the one pip would give, and says which
matcher decided. Standard library only.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, List, Optional, Tuple

from runner.errors import RunnerError

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


class VersionError(RunnerError, ValueError):
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
        # PEP 440 as packaging reads it: <V means <V.dev0 unless V is itself a pre/dev
        # release, so V's own pre- and dev-releases (for V = X.postN, X.postN.devM) are out.
        if want.pre is not None or want.dev is not None:
            return version.public < want
        return version.public < Version(want.epoch, want.release, want.pre, want.post, 0, None)
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
