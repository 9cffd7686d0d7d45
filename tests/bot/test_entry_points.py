"""The handler a manifest names is read with ``ast``: hostile or odd module files give a
message naming the file, never an exception, also from two threads at once."""

from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

from bot.manifest.entry_points import check_entry_points


def _task(handler: str) -> SimpleNamespace:
    return SimpleNamespace(kind="classify", handler=handler)


def test_a_module_nested_deeper_than_the_parser_goes_is_named(tmp_path: Path) -> None:
    (tmp_path / "deep.py").write_text("x = " + "-" * 200_000 + "1\ndef handle(b): return b\n")
    found = list(check_entry_points(_task("deep:handle"), tmp_path))
    assert found == [(("task", "handler"),
                      "deep.py: too deeply nested for Python to parse")]


def test_a_missing_function_gets_a_did_you_mean(tmp_path: Path) -> None:
    (tmp_path / "mod.py").write_text("def handle(batch):\n    return batch\n")
    [(loc, message)] = check_entry_points(_task("mod:handel"), tmp_path)
    assert loc == ("task", "handler") and "'handel' is not defined in mod.py" in message
    assert "handle" in message.split("is not defined", 1)[1]


def test_many_threads_check_handlers_at_once(tmp_path: Path) -> None:
    # Two approvals at once parse the same module: CPython 3.11's parser failed once with
    # "SystemError: AST constructor recursion depth mismatch" when two threads parsed.
    body = "".join(f"def f{i}(x):\n    return [[[[x + {i}]]]] if x else -(-(-(x)))\n"
                   for i in range(300))
    (tmp_path / "mod.py").write_text(body + "def handle(batch):\n    return batch\n")
    errors: list[BaseException] = []
    results: list[list[object]] = []

    def check() -> None:
        try:
            for _ in range(20):
                results.append(list(check_entry_points(_task("mod:handle"), tmp_path)))
        except BaseException as exc:  # noqa: BLE001 - any error is the failure
            errors.append(exc)

    threads = [threading.Thread(target=check) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors and len(results) == 80 and all(r == [] for r in results)
