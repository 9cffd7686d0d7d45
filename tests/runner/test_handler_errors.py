"""Where a handler raised: the project's own line named, the traceback kept, the file
capped (runner/handler_errors.py, issue 37)."""

from __future__ import annotations

import json
from pathlib import Path

from runner import handler_errors
from runner.handler_errors import ERRORS_FILE, KEPT_MAX, formatted, keep, where


def _raised(tmp_path: Path) -> BaseException:
    project = tmp_path / "project"
    project.mkdir()
    (project / "team.py").write_text("import json\n\ndef handle(text):\n"
                                     "    return json.loads(text)\n")
    scope: dict[str, object] = {}
    exec(compile((project / "team.py").read_text(), str(project / "team.py"), "exec"), scope)
    try:
        scope["handle"]("{not json")  # type: ignore[operator]
    except ValueError as exc:
        return exc
    raise AssertionError("did not raise")


def test_the_projects_own_line_is_named_not_the_librarys(tmp_path: Path) -> None:
    exc = _raised(tmp_path)
    assert where(exc, str(tmp_path / "project")) == f"{tmp_path / 'project' / 'team.py'}:4"
    assert "json" in str(where(exc))  # no project given: the deepest frame, in the library
    assert "JSONDecodeError" in formatted(exc) and "team.py" in formatted(exc)


def test_tracebacks_are_kept_up_to_a_cap(tmp_path: Path) -> None:
    assert keep(str(tmp_path), ["a", "b"], "task.handler raised X", "f.py:1", "trace", batch=3)
    line = json.loads((tmp_path / ERRORS_FILE).read_text())
    assert line == {"ids": ["a", "b"], "items": 2, "error": "task.handler raised X",
                    "where": "f.py:1", "traceback": "trace", "batch": 3}
    for _ in range(KEPT_MAX):
        keep(str(tmp_path), ["a"], "e", None, "t")
    assert len((tmp_path / ERRORS_FILE).read_text().splitlines()) == KEPT_MAX
    assert not keep(str(tmp_path / "gone"), ["a"], "e", None, "t")  # unwritable: no crash
    assert handler_errors.TRACEBACK_CHARS > 0
