"""Version matching without ``packaging``, checked against ``packaging`` itself."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from packaging.specifiers import SpecifierSet
from packaging.version import Version as PVersion

from runner.requirements import (
    VersionError,
    check_requirements,
    evaluate_marker,
    parse_requirement,
    parse_version,
    read_requirements,
    satisfies,
    satisfies_builtin,
)


@pytest.mark.parametrize(("version", "spec", "expected"), [
    ("2.13.0", ">=2.1", True),
    ("2.13.0+cpu", "==2.13.0", True),
    ("2.13.0+cpu", "==2.13.0+cu121", False),
    ("2.13.0", "<2.13", False),
    ("1.0", "==1.0.0", True),
    ("1.4.2", "~=1.4", True),
    ("2.0", "~=1.4", False),
    ("1.4.2", "~=1.4.1", True),
    ("1.5.0", "~=1.4.1", False),
    ("3.11.7", "==3.11.*", True),
    ("3.12.0", "==3.11.*", False),
    ("3.12.0", "!=3.11.*", True),
    ("2.0rc1", "<2.0", False),
    ("2.0rc1", ">=1.9", True),
    ("1.0.post1", ">1.0", False),
    ("1.1", ">1.0", True),
    ("1.0+local", ">1.0", False),
    ("1!0.5", ">=2.0", True),
    ("1.0.dev1", "<1.0", False),
    ("0.9.dev1", "<1.0", True),
    ("1.0a1", "<1.0b1", True),
    ("1.0.post1.dev0", "<1.0.post1", False),  # <V is <V.dev0 for a final V
    ("1.0.post0.dev0", "<1.0.post1", True),
    ("1.0a1", "<1.0.post1", True),
    ("4.16.0", ">=4.10.0, <5", True),
    ("4.16.0", "", True),
])
def test_builtin_matcher(version: str, spec: str, expected: bool) -> None:
    assert satisfies_builtin(version, spec) is expected
    assert SpecifierSet(spec).contains(PVersion(version), prereleases=True) is expected


def test_packaging_is_used_when_present() -> None:
    assert satisfies("2.0", ">=1") == (True, "packaging")


@pytest.mark.parametrize("bad", ["abc", "1.0-beta-x", ""])
def test_bad_versions_are_named(bad: str) -> None:
    with pytest.raises(VersionError, match="not a PEP 440 version"):
        parse_version(bad)


def test_bad_specifier_is_named() -> None:
    with pytest.raises(VersionError, match="not a version specifier"):
        satisfies_builtin("1.0", "=>1.0")
    with pytest.raises(VersionError, match="wildcard"):
        satisfies_builtin("1.0", ">=1.*")


_versions = st.builds(
    lambda rel, pre, post, dev, local: ".".join(map(str, rel)) + pre + post + dev + local,
    st.lists(st.integers(0, 3), min_size=1, max_size=4),
    st.sampled_from(["", "a1", "b2", "rc1", "rc0"]),
    st.sampled_from(["", ".post1", ".post0"]),
    st.sampled_from(["", ".dev0", ".dev3"]),
    st.sampled_from(["", "+cpu", "+cu121.1"]),
)
_ops = st.sampled_from(["==", "!=", "<=", ">=", "<", ">", "~="])
_targets = st.builds(
    lambda rel, pre, post: ".".join(map(str, rel)) + pre + post,
    st.lists(st.integers(0, 3), min_size=1, max_size=3),
    st.sampled_from(["", "a1", "rc1"]),
    st.sampled_from(["", ".post1"]),
)


@settings(max_examples=400, deadline=None)
@given(version=_versions, op=_ops, target=_targets, star=st.booleans())
def test_builtin_agrees_with_packaging(version: str, op: str, target: str, star: bool) -> None:
    assume(not (op == "~=" and len(parse_version(target).release) < 2))
    if star and op in ("==", "!=") and target.replace(".", "").isdigit():
        target += ".*"
    spec = f"{op}{target}"
    want = SpecifierSet(spec).contains(PVersion(version), prereleases=True)
    assert satisfies_builtin(version, spec) is want, (version, spec)


def test_version_ordering_agrees_with_packaging() -> None:
    texts = ["1.0.dev1", "1.0a1", "1.0a1.post1", "1.0b1", "1.0rc1", "1.0", "1.0+a",
             "1.0+1", "1.0.post1.dev0", "1.0.post1", "1.1.dev0", "1!0.1"]
    assert sorted(texts, key=lambda t: parse_version(t).key()) == \
        sorted(texts, key=PVersion)


def test_markers() -> None:
    env = {"python_version": "3.11", "sys_platform": "linux", "platform_machine": "x86_64",
           "extra": ""}
    assert evaluate_marker('python_version >= "3.9" and sys_platform == "linux"', env)
    assert not evaluate_marker("python_version < '3.9'", env)
    assert evaluate_marker('(sys_platform == "win32" or platform_machine == "x86_64")', env)
    assert evaluate_marker("'linux' in sys_platform", env)
    with pytest.raises(VersionError, match="unknown marker variable"):
        evaluate_marker("flavour == 'x'", env)


def test_requirement_lines() -> None:
    req = parse_requirement("Flash_Attn[cuda] >= 2.5, < 3 ; sys_platform == 'linux'", "f:1")
    assert (req.name, req.specifier, req.marker) == ("Flash_Attn", ">=2.5,<3",
                                                     "sys_platform == 'linux'")
    url = parse_requirement("mypkg @ https://example.invalid/mypkg.whl", "f:2")
    assert url.url and url.specifier == ""


def test_file_with_includes_options_and_bad_lines(tmp_path: Path) -> None:
    (tmp_path / "base.txt").write_text("PyYAML>=6\n")
    main = tmp_path / "requirements-rebuild.txt"
    main.write_text("--index-url https://example.invalid/simple\n-r base.txt\n"
                    "torch>=2.1  # the node's own build\n\nwhat is this\n"
                    "winonly ; sys_platform == 'win32'\n-r missing.txt\n")
    reqs, problems = read_requirements(str(main))
    assert [r.name for r in reqs] == ["PyYAML", "torch", "winonly"]
    assert [p["where"].rsplit(":", 1)[1] for p in problems] == ["5", "7"]
    installed = {"pyyaml": "6.0.2", "torch": "2.0.1"}
    report = check_requirements(str(main), installed=installed)
    assert [m["name"] for m in report.mismatched] == ["torch"]
    assert report.skipped_by_marker == ["winonly"]
    assert len(report.unreadable) == 2 and not report.ok
    assert report.to_dict()["satisfied"] == 1


def test_pip_compile_output_with_hashes_and_continuations(tmp_path: Path) -> None:
    main = tmp_path / "requirements-rebuild.txt"
    main.write_bytes(
        "\ufeff# generated by pip-compile --generate-hashes\n"
        "pyyaml==6.0.2 \\\n"
        "    --hash=sha256:0a9a2848a5b7feac301353437eb7d5957887edbf81d56e903999a75a3d743086 \\\n"
        "    --hash=sha256:0b69e4ce7a131fe56b7e4d770c67429700908fc0752af059838b1cfb41960e4e\n"
        "    # via -r requirements.in\n"
        "torch==2.1.0 --hash=sha256:abc ; sys_platform == 'linux'\n".encode("utf-8"))
    reqs, problems = read_requirements(str(main))
    assert problems == []
    assert [(r.name, r.specifier, r.source.rsplit(":", 1)[1]) for r in reqs] == \
        [("pyyaml", "==6.0.2", "2"), ("torch", "==2.1.0", "6")]
    report = check_requirements(str(main), installed={"pyyaml": "6.0.2", "torch": "2.1.0"})
    assert report.ok and report.checked == 2


def test_urls_and_paths_without_a_name(tmp_path: Path) -> None:
    main = tmp_path / "requirements.txt"
    main.write_text(
        "https://download.example.invalid/whl/torch-2.1.0%2Bcu121-cp311-cp311-linux_x86_64.whl\n"
        "./wheels/flash_attn-2.5.8-cp311-cp311-linux_x86_64.whl\n"
        "git+https://github.com/example/tool.git@v1#egg=example-tool\n"
        "./vendored/somepkg\n")
    reqs, problems = read_requirements(str(main))
    assert [(r.name, r.specifier) for r in reqs] == [
        ("torch", "==2.1.0+cu121"), ("flash_attn", "==2.5.8"), ("example-tool", "")]
    report = check_requirements(str(main), installed={"torch": "2.1.0+cpu",
                                                      "flash-attn": "2.5.8"})
    assert [m["name"] for m in report.mismatched] == ["torch"]
    assert [m["name"] for m in report.missing] == ["example-tool"]
    assert [u["line"] for u in report.unchecked] == ["./vendored/somepkg"]
    assert not report.unreadable and report.to_dict()["unchecked"] == report.unchecked
