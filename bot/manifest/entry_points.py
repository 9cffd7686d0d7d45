"""The handler and trainer a manifest names, resolved against the project without running
it: the module file exists, the function is defined (read with ``ast``, so nothing is
imported, no torch), and a near miss gets a did-you-mean.

Modules of Preflight's own runner (``runner.…``, the built-in workloads such as
``runner.workloads.classify:handle``) travel with every run: they are resolved against
Preflight's own source, the same way and with the same did-you-mean.
"""

from __future__ import annotations

import ast
import difflib
import threading
from collections.abc import Iterator
from pathlib import Path

import runner
from bot.manifest.source import FieldPath

MAX_MODULES = 2000  # a did-you-mean looks at this many module files of the project at most
# CPython 3.11's parser is not safe in two threads at once: two approvals checked by two
# threads failed with "SystemError: AST constructor recursion depth mismatch". One at a time.
_PARSE_LOCK = threading.Lock()
Finding = tuple[FieldPath, str]


def check_entry_points(task: object, project_dir: Path) -> Iterator[Finding]:
    """(field path, message) for every handler/trainer that would not resolve."""
    handler = getattr(task, "handler", None)
    if isinstance(handler, str) and getattr(task, "kind", None) != "train":
        yield from _check(("task", "handler"), handler, project_dir, need_object=True)
    trainer = getattr(task, "trainer", None)
    if isinstance(trainer, str) and getattr(task, "kind", None) == "train":
        yield from _check(("task", "trainer"), trainer, project_dir, need_object=False)


def _check(loc: FieldPath, ref: str, project_dir: Path, *,
           need_object: bool) -> Iterator[Finding]:
    module, _, name = ref.partition(":")
    if not module:
        return
    if need_object and not name:
        yield loc, f"{ref!r}: expected 'module:function'"
        return
    own = module.split(".")[0] == "runner"
    if own:  # Preflight's own workloads: looked up in Preflight's source
        project_dir = Path(runner.__file__).resolve().parent.parent
    path = module_file(project_dir, module)
    if path is None:
        tail = module.replace(".", "/")
        where = ("Preflight's own runner" if own else "the project") + f" {project_dir}"
        known = _modules(project_dir / "runner", prefix="runner") if own else \
            _modules(project_dir)
        yield loc, (f"module {module!r} not found in {where} (looked for "
                    f"{tail}.py and {tail}/__init__.py)" + _did_you_mean(module, known))
        return
    if not name:
        return
    try:
        source = path.read_bytes()
        with _PARSE_LOCK:
            tree = ast.parse(source, filename=str(path))
    except SyntaxError as exc:
        yield loc, f"{path.relative_to(project_dir)} line {exc.lineno}: syntax error: {exc.msg}"
        return
    except (RecursionError, MemoryError):  # nested deeper than the parser goes
        yield loc, f"{path.relative_to(project_dir)}: too deeply nested for Python to parse"
        return
    except (OSError, ValueError) as exc:
        yield loc, f"cannot read {path}: {exc}"
        return
    defined = _top_level_names(tree)
    if name not in defined:
        yield loc, (f"{name!r} is not defined in {path.relative_to(project_dir)}"
                    + _did_you_mean(name, sorted(defined)))


def module_file(project_dir: Path, module: str) -> Path | None:
    base = project_dir.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _top_level_names(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _modules(project_dir: Path, *, prefix: str = "") -> list[str]:
    out: list[str] = []
    for path in project_dir.rglob("*.py"):
        parts = (*prefix.split(".")[:1 if prefix else 0],
                 *path.relative_to(project_dir).with_suffix("").parts)
        if any(p.startswith(".") or p in ("site-packages", "node_modules") for p in parts):
            continue
        out.append(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        if len(out) >= MAX_MODULES:
            break
    return out


def _did_you_mean(word: str, choices: list[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=3, cutoff=0.6)
    return f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
