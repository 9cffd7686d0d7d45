"""The house rules of docs/architecture.md, checked on the source itself."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CONTRACT = {"runner", "runner.spec", "runner.events", "runner.balance", "runner.evidence",
            "runner.outputs",
            "runner.inputs", "runner.errors", "runner.files", "runner.frames",
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
    ("asyncssh", "bot/nodes/ssh/"),
    # the local node starts its runner; the launcher starts it on a node
    ("subprocess", ("bot/nodes/", "bot/node_programs/")),
])
def test_libraries_stay_in_their_module(library: str, home: str | tuple[str, ...]) -> None:
    bad = [where(p, n) for p in modules("bot") for m, n in imports(p)
           if m.split(".")[0] == library
           and not str(p.relative_to(REPO)).startswith(home)]
    assert bad == [], f"{library} is imported outside {home}"


# Code of bot/ that runs on a node, not in the bot (sent as its text): the launcher hands
# the node's own environment on to the runner it starts there, and a Ray hold reads the
# temp dir its launcher names in it.
ON_THE_NODE = ("bot/node_programs/launcher.py", "bot/node_programs/ray_hold.py")


def test_node_programs_import_only_the_standard_library() -> None:
    """bot/node_programs/ is what runs on a node, sent as its text, before anything of ours
    is there: a program imports the standard library only (its package's ``__init__``,
    the bot's side that reads the texts, too), or, for mypy, a program sent in front of it
    (the launcher names untar.py's functions under ``TYPE_CHECKING``)."""
    allowed = set(sys.stdlib_module_names) | {"__future__"}
    found = modules("bot/node_programs")
    assert {p.name for p in found} >= {"launcher.py", "untar.py", "ray_hold.py",
                                        "corpus_listing.py"}
    bad = [f"{where(p, n)} imports {m}" for p in found for m, n in imports(p)
           if m.split(".")[0] not in allowed and not m.startswith("bot.node_programs.")]
    assert bad == []


# The node kinds are named by their adapters (bot/nodes/) and the manifest's node models
# (bot/manifest/nodes.py) only; everything else asks the typed node (is_remote, label, ...).
KIND_HOMES = ("bot/nodes/", "bot/manifest/nodes.py")


def kind_literals(path: Path, kinds: set[str]) -> list[tuple[int, str]]:
    """Where a module names a node kind by its literal: compared with something named
    ``kind`` (``node.kind == "ssh"``, ``kind in ("local", ...)``, ``run.node_kind != ...``),
    as the default of ``.get("kind", "local")``, or in a ``Literal[...]`` type."""
    found: list[tuple[int, str]] = []

    def literals(node: ast.AST) -> list[str]:
        return [c.value for c in ast.walk(node)
                if isinstance(c, ast.Constant) and isinstance(c.value, str) and c.value in kinds]

    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            if any("kind" in ast.unparse(s) for s in sides):
                found += [(node.lineno, f"compares a kind with {k!r}")
                          for s in sides for k in literals(s)]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get" and len(node.args) == 2 \
                and isinstance(node.args[0], ast.Constant) and node.args[0].value == "kind":
            found += [(node.lineno, f"defaults a kind to {k!r}") for k in literals(node.args[1])]
        elif isinstance(node, ast.Subscript) and ast.unparse(node.value).endswith("Literal"):
            found += [(node.lineno, f"types a value as {k!r}") for k in literals(node.slice)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            # SQL or shell text: ``json_extract(node, '$.kind') = 'ssh'``
            found += [(node.lineno, f"quotes {k!r} in a text that names a kind")
                      for k in sorted(kinds) if "kind" in node.value
                      and re.search(rf"""['"]{re.escape(k)}['"]""", node.value)]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("bot.nodes") \
                and any(a.name == "KIND" for a in node.names):
            found.append((node.lineno, f"imports the kind name of {node.module}"))
    return found


def test_the_kind_literal_finder_finds_them(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text('a = node.kind == "ssh"\nb = n.get("kind", "local")\n'
                      'c = run.node_kind in ("local",)\nd = {"ssh": 1}\ne = k == "local"\n'
                      'f: Literal["local", "x"] = "x"\n'
                      'g = "json_extract(v, \'$.kind\') = \'ssh\'"\n'
                      'from bot.nodes.ssh import KIND as SSH_KIND\n', encoding="utf-8")
    assert sorted(kind_literals(sample, {"local", "ssh"})) == [
        (1, "compares a kind with 'ssh'"), (2, "defaults a kind to 'local'"),
        (3, "compares a kind with 'local'"), (6, "types a value as 'local'"),
        (7, "quotes 'ssh' in a text that names a kind"),
        (8, "imports the kind name of bot.nodes.ssh")]


def test_only_the_node_adapters_and_models_name_a_kind() -> None:
    from bot.manifest.nodes import NODE_MODELS
    from bot.nodes.registry import KINDS

    assert set(KINDS) == set(NODE_MODELS), "every kind the manifest takes has an adapter"
    bad = [f"{where(path, line)} {what}" for path in modules("bot")
           if not _importer(path).startswith(KIND_HOMES)
           for line, what in kind_literals(path, set(KINDS))]
    assert bad == []


def test_the_dispatch_reads_no_manifest_but_its_plan() -> None:
    """A start is handed its launch plan (bot/dispatch/plan.py), taken once from the run's
    checked manifest: no other module of the dispatch or the node kinds parses YAML (the
    run directory's manifest.yaml read back as a raw dict)."""
    bad = [f"{where(p, n)} imports {m}" for p, m, n in _bot_imports()
           if m.split(".")[0] == "yaml" and _importer(p).startswith(("bot/dispatch/", "bot/nodes/"))
           and _importer(p) != "bot/dispatch/plan.py"]
    assert bad == []


# Where the service still touches a run's spec.json (issue 33 wants none: the service holds
# what it decided as values). A ratchet: a new reader is an error; these say why they read.
SPEC_TOUCHERS = {
    "bot/service/pilot_service.py": "its one writer, at submission",
    "bot/service/handles.py": "the handle names the file for the dispatch",
    "bot/service/run_checks.py": "a start checks the file's paths against the run's record",
    "bot/service/report_files.py": "the evidence home the bot resolved, read from the spec",
    "bot/service/proven.py": "the approved time limit, before a widened one is decided",
}


def test_the_service_touches_spec_json_only_where_listed() -> None:
    touches = re.compile(r'\bspec_path\b|"spec\.json"')
    found = {_importer(p) for p in modules("bot/service")
             if touches.search(p.read_text(encoding="utf-8"))}
    assert found <= set(SPEC_TOUCHERS), sorted(found - set(SPEC_TOUCHERS))


# Where the dispatch still reads a run's spec.json or manifest.yaml back (issue 33 wants
# none: a start is handed its typed plan). A ratchet, like SPEC_TOUCHERS: a new reader is
# an error; these say why they still read.
DISPATCH_READERS = {
    "bot/dispatch/plan.py": "the one reader: the spec once per start (spec_text_of), and "
                            "read_plan for a handle built without its plan (a test, a tool)",
}
READS_RUN_FILES = re.compile(r"\bload_spec\(|\bread_plan\(|safe_load\(|spec_path\.read_"
                             r"|/ \"manifest\.yaml\"")


def test_the_dispatch_reads_run_files_only_where_listed() -> None:
    found = {_importer(p) for p in modules("bot/dispatch")
             if READS_RUN_FILES.search(p.read_text(encoding="utf-8"))}
    assert found <= set(DISPATCH_READERS), sorted(found - set(DISPATCH_READERS))
    bad = [_importer(p) for p in modules("bot/service")
           if re.search(r"\bload_spec\(|\bread_plan\(|safe_load\(", p.read_text("utf-8"))]
    assert bad == [], "the service reads no manifest.yaml or spec.json back as a dict"


def test_only_settings_reads_the_environment() -> None:
    bad = []
    for path in modules("bot"):
        if path.name == "settings.py" or _importer(path) in ON_THE_NODE:
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv") \
                    and isinstance(node.value, ast.Name) and node.value.id == "os":
                bad.append(where(path, node.lineno))
    assert bad == []


# -- layers by folder ---------------------------------------------------------------

def _importer(path: Path) -> str:
    return str(path.relative_to(REPO))


def _bot_imports() -> list[tuple[Path, str, int]]:
    return [(p, m, n) for p in modules("bot") for m, n in imports(p)]


def test_only_the_store_talks_sql() -> None:
    bad = [f"{where(p, n)} imports {m}" for p, m, n in _bot_imports()
           if m.split(".")[0] in ("sqlite3", "sqlite_utils")
           and not _importer(p).startswith("bot/store/")]
    assert bad == []


PURE = ("bot/manifest/", "bot/pilot/")
NOT_FROM_PURE = ("bot.store", "bot.dispatch", "bot.nodes", "bot.slack", "bot.cli", "bot.console",
                 "bot.service", "bot.compose", "bot.schedule")


def test_manifest_and_pilot_import_no_store_dispatch_transport_or_service() -> None:
    bad = [f"{where(p, n)} imports {m}" for p, m, n in _bot_imports()
           if _importer(p).startswith(PURE)
           and any(m == f or m.startswith(f + ".") for f in NOT_FROM_PURE)]
    assert bad == []


TRANSPORTS = ("bot.slack", "bot.console", "bot.cli")
# The entry point: `preflight` (bot/cli, also `python -m bot`) composes the terminal
# transport's rendering (bot/console) and starts the Slack transport (`serve`).
ENTRY = ("bot/cli/", "bot/__main__.py")


def test_nothing_imports_a_transport_but_the_entry_point() -> None:
    bad = []
    for path, module, line in _bot_imports():
        here = _importer(path)
        for transport in TRANSPORTS:
            own = here.startswith(transport.replace(".", "/") + "/")
            if (module == transport or module.startswith(transport + ".")) and not own \
                    and not here.startswith(ENTRY):
                bad.append(f"{where(path, line)} imports {module}")
    assert bad == []


# the transports, and the scheduler that runs the service's jobs on a clock
STORE_FREE = ("bot/slack/", "bot/cli/", "bot/console/", "bot/schedule.py")


def test_transports_never_reach_the_store() -> None:
    """A transport asks the service: it imports nothing of bot.store and reads no
    ``<something>.store`` (a service's store). The Slack notifier keeps its message
    references through its own protocol (``MessageRefs``), handed the store by
    ``bot.compose.make_service``; it reads them as ``self.store``."""
    bad = [f"{where(p, n)} imports {m}" for p, m, n in _bot_imports()
           if _importer(p).startswith(STORE_FREE)
           and (m == "bot.store" or m.startswith("bot.store."))]
    for path in modules("bot"):
        if not _importer(path).startswith(STORE_FREE):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ImportFrom) and node.module == "bot" \
                    and any(a.name == "store" for a in node.names):
                bad.append(f"{where(path, node.lineno)} imports bot.store")
            if isinstance(node, ast.Attribute) and node.attr == "store" \
                    and not (isinstance(node.value, ast.Name) and node.value.id == "self"):
                bad.append(f"{where(path, node.lineno)} reads {ast.unparse(node)}")
            # nor patches the service it was given (``service.notifier = ...``, or its
            # guard's directory): what a transport brings is handed to make_service
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            for target in targets:
                if isinstance(target, ast.Attribute) and "service" in ast.unparse(target.value):
                    bad.append(f"{where(path, node.lineno)} sets {ast.unparse(target)}")
    assert bad == []


IO_MODULES = {"os", "subprocess", "sqlite3", "sqlite_utils", "shutil", "socket", "tempfile",
              "asyncssh", "urllib", "http", "io"}
IO_METHODS = {"read_text", "read_bytes", "write_text", "write_bytes", "open", "mkdir",
              "unlink", "rmdir", "touch", "iterdir", "glob", "rglob", "exists", "is_file",
              "is_dir", "stat", "lstat"}


def pilot_io(path: Path) -> list[tuple[int, str]]:
    """What in a module of the pure rules does I/O, by line: an I/O module imported,
    ``open()``, a Path's reads and writes, ``os.``, or a ``store`` handed in to act on."""
    found = [(n, f"imports {m}") for m, n in imports(path) if m.split(".")[0] in IO_MODULES]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "open":
            found.append((node.lineno, "calls open()"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in IO_METHODS:
            found.append((node.lineno, f"calls .{node.func.attr}()"))
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                and node.value.id == "os":
            found.append((node.lineno, f"uses os.{node.attr}"))
        elif isinstance(node, ast.arg) and node.arg == "store":
            found.append((node.lineno, "is handed a store"))
    return sorted(found)


def test_the_pilot_io_finder_finds_io(tmp_path: Path) -> None:
    sample = tmp_path / "sample.py"
    sample.write_text("import os\nfrom pathlib import Path\n\n\ndef f(store, p: Path) -> str:\n"
                      "    os.getpid()\n    open('x')\n    return p.read_text()\n",
                      encoding="utf-8")
    assert pilot_io(sample) == [(1, "imports os"), (5, "is handed a store"),
                                (6, "uses os.getpid"), (7, "calls open()"),
                                (8, "calls .read_text()")]


def test_pilot_does_no_io() -> None:
    """bot/pilot/ is the pure rules: values in, decisions out. Reading files, the store or
    the environment is the service's (bot/service/) or the manifest loader's."""
    bad = [f"{where(path, line)} {what}" for path in modules("bot")
           if _importer(path).startswith("bot/pilot/") for line, what in pilot_io(path)]
    assert bad == []


# -- no import cycle, not even inside a function ----------------------------------------

def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Every module of bot/ and runner/ -> the modules of ours it imports, anywhere in it
    (module level and inside functions); ``from pkg import mod`` counts as ``pkg.mod``."""
    paths = modules("bot") + modules("runner")
    known = {_module_name(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        name = _module_name(path)
        edges: set[str] = set()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module is not None:
                base = node.module
                if node.level:
                    package = name.split(".")[: -node.level or None]
                    if path.name == "__init__.py":
                        package = name.split(".")[: len(name.split(".")) - node.level + 1]
                    base = ".".join([*package, node.module])
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                           for a in node.names]
            edges |= {t for t in targets if t in known and t != name}
        graph[name] = edges
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first == last), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycle_in_bot_or_runner() -> None:
    graph = import_graph()
    assert "bot.service.pilot_service" in graph \
        and "bot.service.follower" in graph["bot.service.pilot_service"]
    cycle = find_cycle(graph)
    assert cycle is None, " -> ".join(cycle or [])


def runner_parts(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The runner's import graph by part: a sub-package (``runner.stages``,
    ``runner.blender``, ``runner.workloads``) is one node, a top-level module another."""

    def part(module: str) -> str:
        return ".".join(module.split(".")[:2])

    parts: dict[str, set[str]] = {}
    for module, targets in graph.items():
        if module == "runner" or not module.startswith("runner."):
            continue
        edges = parts.setdefault(part(module), set())
        edges |= {part(t) for t in targets if t.startswith("runner.") and part(t) != part(module)}
    return parts


def test_runner_parts_collapse_sub_packages() -> None:
    graph = {"runner.stages.pilot": {"runner.volume", "runner.stage"},
             "runner.volume": {"runner.stages.batches"}, "runner.stage": set()}
    parts = runner_parts(graph)
    assert parts == {"runner.stages": {"runner.volume", "runner.stage"},
                     "runner.volume": {"runner.stages"}, "runner.stage": set()}
    assert find_cycle(parts) is not None


def test_no_import_cycle_between_runner_parts() -> None:
    """The arrows in runner/ point one way: the framework (runner/stage.py) <- the stages,
    blender/, workloads/, volume <- the ladder; a stage module never imports back up."""
    parts = runner_parts(import_graph())
    assert {"runner.stage", "runner.stages", "runner.ladder"} <= set(parts)
    cycle = find_cycle(parts)
    assert cycle is None, " -> ".join(cycle or [])


SETTINGS_READERS = ("bot/settings.py", "bot/cli/", "bot/slack/serve.py")


def test_only_the_entry_points_build_settings_from_the_environment() -> None:
    """Settings is built once where the bot starts and passed down; a dispatcher is given
    what it needs (the local runner's environment), it never reads it itself."""
    bad = []
    for path in modules("bot"):
        if _importer(path).startswith(SETTINGS_READERS):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Attribute) and node.attr == "from_env":
                bad.append(where(path, node.lineno))
    assert bad == []


RUN_NAMES = {"run", "pilot", "parent", "volume_run", "previous"}


def test_a_run_is_passed_typed_outside_the_store() -> None:
    """Outside bot/store, a run travels as its typed record (bot.pilot.record: RunRecord,
    Run), checked once where it leaves the store: no parameter named for a run is a
    ``dict[str, Any]`` read back by string keys."""
    bad = []
    for path in modules("bot"):
        if path.relative_to(REPO).as_posix().startswith("bot/store/"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in ast.walk(tree):
            if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            args = [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]
            bad += [f"{where(path, a.lineno)}: {a.arg}: {ast.unparse(a.annotation)}"
                    for a in args if a.arg in RUN_NAMES and a.annotation is not None
                    and ast.unparse(a.annotation).replace(" ", "").startswith("dict[")]
    assert bad == []
