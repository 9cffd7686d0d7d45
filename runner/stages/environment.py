"""The environment stage: the project's requirements are installed at good versions."""

from __future__ import annotations

import os
import sys
from typing import Any, Dict, List, Optional

from runner.spec import RunSpec
from runner.stages import StageContext, StageFailure


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
                           hint="install the listed packages into the interpreter your "
                                "project runs with (node.python; this run used "
                                f"{sys.executable}), e.g. `<node.python> -m pip install -r "
                                f"{path}`; never into Preflight's own environment")
    return facts


def requirements_path(spec: RunSpec) -> Optional[str]:
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
