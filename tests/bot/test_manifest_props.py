"""Property tests: random and mutated manifests never crash the loader, and every refusal
carries a field path and a line."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bot.errors import ManifestError
from bot.manifest.load import load_manifest
from tests.bot.manifest_helpers import BASE, make_project

SETTINGS = settings(max_examples=400, deadline=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture,
                                           HealthCheck.too_slow])

scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**20, 10**20),
                    st.floats(allow_nan=True), st.text(max_size=30),
                    st.sampled_from(["H100", "b200", "cuda", "rocm", "7", "doc-07",
                                     "xoxb-123456789", "2024-13-01", "~/x", "preflight/v1",
                                     ""]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=12), inner, max_size=4)),
    max_leaves=12)


def _paths(data: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    out = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            out += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            out += _paths(value, (*prefix, index))
    return out


@st.composite
def mutated(draw: st.DrawFn) -> dict[str, Any]:
    data = copy.deepcopy(BASE)
    for _ in range(draw(st.integers(1, 4))):
        paths = _paths(data)
        if not paths:
            break
        path = draw(st.sampled_from(paths))
        parent: Any = data
        for element in path[:-1]:
            parent = parent[element]
        action = draw(st.sampled_from(["set", "delete", "rename"]))
        if action == "set":
            parent[path[-1]] = draw(values)
        elif isinstance(parent, dict):
            value = parent.pop(path[-1])
            if action == "rename":
                parent[draw(st.text(min_size=1, max_size=10))] = value
    return data


def assert_located(tmp: Path, text: str) -> None:
    try:
        load_manifest(text, source="prop", base_dir=tmp)
    except ManifestError as exc:
        assert exc.problems, "a refusal without problems"
        for problem in exc.problems + exc.warnings:
            assert problem.loc, problem
            assert problem.line is not None and problem.line >= 1, problem


@pytest.fixture(scope="module")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_project(tmp_path_factory.mktemp("project"))


@SETTINGS
@given(data=mutated(), as_json=st.booleans())
def test_mutated_manifests(project: Path, data: dict[str, Any], as_json: bool) -> None:
    text = json.dumps(data, indent=2) if as_json else yaml.safe_dump(data, allow_unicode=True)
    assert_located(project, text)


@SETTINGS
@given(st.text(max_size=200))
def test_random_text(project: Path, text: str) -> None:
    assert_located(project, text)


@SETTINGS
@given(st.data())
def test_damaged_yaml_text(project: Path, data: st.DataObject) -> None:
    text = yaml.safe_dump(BASE, sort_keys=False)
    for _ in range(data.draw(st.integers(1, 3))):
        at = data.draw(st.integers(0, len(text)))
        cut = data.draw(st.integers(0, 5))
        insert = data.draw(st.sampled_from(["", ":", "-", " ", "\n", "\t", "[", "{", "&a", "*a",
                                            "'", '"', "#", "!!int ", "?", "<<: *a\n"]))
        text = text[:at] + insert + text[at + cut:]
    assert_located(project, text)
