"""The interpreter stage: which Python runs the runner, and is it the one the project asks for."""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import Any, Dict

from runner.stage import StageContext, StageFailure


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
