"""The house rules of docs/architecture.md, checked on the source itself."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONTRACT = {"runner", "runner.spec", "runner.events", "runner.balance", "runner.evidence",
            "runner.inputs", "runner.errors", "runner.files", "runner.blender.frames",
            "runner.raypin"}


def modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def imports(path: Path, *, top_level_only: bool = False) -> list[tuple[str, int]]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found: list[tuple[str, int]] = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.module, node.lineno))
    return found


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def test_runner_never_imports_bot() -> None:
    bad = [f"{where(p, n)} imports {m}" for p in modules("runner") for m, n in imports(p)
           if m == "bot" or m.startswith("bot.")]
    assert bad == []


def test_runner_module_level_imports_are_stdlib_only() -> None:
    allowed = set(sys.stdlib_module_names) | {"runner", "__future__"}
    bad = [f"{where(p, n)} imports {m} at module level"
           for p in modules("runner") for m, n in imports(p, top_level_only=True)
           if m.split(".")[0] not in allowed]
    assert bad == []


def test_bot_imports_only_the_runner_contract() -> None:
    bad = [f"{where(p, n)} imports {m}" for p in modules("bot") for m, n in imports(p)
           if (m == "runner" or m.startswith("runner.")) and m not in CONTRACT]
    assert bad == []


@pytest.mark.parametrize(("library", "home"), [
    ("slack_bolt", "bot/slack/"), ("slack_sdk", "bot/slack/"),
    ("apscheduler", "bot/schedule.py"), ("sqlite_utils", "bot/store/"),
    ("asyncssh", "bot/dispatch/ssh.py"), ("subprocess", "bot/dispatch/"),
])
def test_libraries_stay_in_their_module(library: str, home: str) -> None:
    bad = [where(p, n) for p in modules("bot") for m, n in imports(p)
           if m.split(".")[0] == library
           and not str(p.relative_to(REPO)).startswith(home)]
    assert bad == [], f"{library} is imported outside {home}"


def test_only_settings_reads_the_environment() -> None:
    bad = []
    for path in modules("bot"):
        if path.name == "settings.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(where(path, node.lineno))
    assert bad == []
