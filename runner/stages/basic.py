"""The standard-library stages run in the runner process: prepare, interpreter, environment."""

from __future__ import annotations

import os
import platform
import re
import shutil
import sys
from typing import Any, Dict, List

from runner import __version__
from runner.stages import StageContext, StageFailure

GIB = 1024 ** 3


def prepare(ctx: StageContext) -> Dict[str, Any]:
    """The run directory is writable, has the free disk asked for, and holds spec.json."""
    run_dir = ctx.run_dir
    probe = os.path.join(run_dir, f".write-probe-{os.getpid()}")
    try:
        with open(probe, "w", encoding="utf-8") as fh:
            fh.write("ok")
        os.remove(probe)
    except OSError as exc:
        raise StageFailure("prepare", f"run directory {run_dir} is not writable: "
                           f"{exc.strerror or exc}",
                           hint="give the runner a run directory it can write") from exc
    usage = shutil.disk_usage(run_dir)
    facts: Dict[str, Any] = {"run_dir": run_dir, "free_disk_gib": round(usage.free / GIB, 3),
                             "total_disk_gib": round(usage.total / GIB, 3),
                             "runner_version": __version__}
    minimum = float(ctx.spec.diagnostics.min_free_disk_gib or 0)
    facts["min_free_disk_gib"] = minimum
    if usage.free / GIB < minimum:
        raise StageFailure(
            "prepare", f"only {usage.free / GIB:.2f} GiB free on the run directory's disk, "
            f"the manifest asks for {minimum:g} GiB", facts=facts,
            hint="free disk space or lower diagnostics.min_free_disk_gib")
    facts["spec_copied"] = _copy_spec(ctx)
    if ctx.resume:
        facts["resumed"] = True
    return facts


def _copy_spec(ctx: StageContext) -> bool:
    """Put the spec in the run directory unless it is already there (the bot writes it)."""
    dest = os.path.join(ctx.run_dir, "spec.json")
    if os.path.exists(dest):
        return False
    tmp = dest + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(ctx.spec.to_json() + "\n")
    os.replace(tmp, dest)
    return True


def interpreter(ctx: StageContext) -> Dict[str, Any]:
    """Which Python runs this, from which environment, and is it the one asked for."""
    in_venv = sys.prefix != sys.base_prefix
    conda = os.environ.get("CONDA_PREFIX") or (
        sys.prefix if os.path.isdir(os.path.join(sys.prefix, "conda-meta")) else None)
    facts: Dict[str, Any] = {
        "executable": sys.executable,
        "version": platform.python_version(),
        "implementation": sys.implementation.name,
        "prefix": sys.prefix,
        "base_prefix": sys.base_prefix,
        "virtualenv": sys.prefix if in_venv else None,
        "conda_prefix": conda,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "isolated": bool(sys.flags.isolated),
        "cpu_count": os.cpu_count(),
    }
    wanted = ctx.spec.python
    if wanted:
        from runner.requirements import VersionError, satisfies

        facts["wanted"] = wanted
        spec_text = python_constraint(wanted)
        try:
            ok, _matcher = satisfies(facts["version"], spec_text)
        except VersionError as exc:
            raise StageFailure("interpreter", f"python constraint {wanted!r} cannot be read: "
                               f"{exc}", facts=facts,
                               hint="write project.python like '>=3.10' or '==3.11.*'") from exc
        facts["matches"] = ok
        if not ok:
            raise StageFailure(
                "interpreter", f"Python {facts['version']} ({sys.executable}) does not "
                f"satisfy project.python {wanted!r}", facts=facts, error_type="WrongInterpreter",
                hint=_interpreter_hint(spec_text, facts["version"]))
    return facts


def python_constraint(wanted: str) -> str:
    """The specifier for ``project.python``: a bare "3.11" means any 3.11 ("==3.11.*")."""
    text = wanted.strip()
    if text[:1] in "<>=!~":
        return text
    return f"=={text}" if text.endswith(".*") else f"=={text}.*"


def _interpreter_hint(spec_text: str, version: str) -> str:
    hint = ("start the runner with the interpreter the project needs (check which python "
            "is first on PATH and which environment is activated)")
    exact = re.fullmatch(r"\s*==\s*(\d+\.\d+)\s*", spec_text)
    if exact and version.startswith(exact.group(1) + "."):
        hint = (f"=={exact.group(1)} means exactly {exact.group(1)}.0 (PEP 440); write "
                f"=={exact.group(1)}.* for any {exact.group(1)}.x, or " + hint)
    return hint


def environment(ctx: StageContext) -> Dict[str, Any]:
    """Every requirement of the project's requirements file is installed at a good version."""
    path = requirements_path(ctx.spec)
    if path is None:
        return {"requirements": None, "note": "no requirements file in the manifest"}
    if not os.path.isfile(path):
        raise StageFailure("environment", f"requirements file {path} does not exist",
                           facts={"requirements": path}, error_type="FileNotFoundError",
                           hint="check project.dir and project.requirements (paths are "
                                "relative to the project directory)")
    from runner.requirements import check_requirements

    try:
        report = check_requirements(path)
    except (OSError, UnicodeDecodeError) as exc:
        raise StageFailure("environment", f"cannot read {path}: {exc}",
                           facts={"requirements": path}) from exc
    facts = {"requirements": path, **report.to_dict()}
    if not report.ok:
        raise StageFailure("environment", _describe_problems(report.to_dict()), facts=facts,
                           error_type="RequirementsNotMet",
                           hint="install the listed packages into this interpreter, e.g. "
                                f"`{sys.executable} -m pip install -r {path}`")
    return facts


def requirements_path(spec: Any) -> Any:
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
