"""The environment stage: the project's requirements are installed at good versions."""

from __future__ import annotations

from typing import Any, Dict

from runner.requirements import check_project_requirements
from runner.stage import StageContext


def environment(ctx: StageContext) -> Dict[str, Any]:
    """Every requirement of the project's requirements file is installed at a good version."""
    return check_project_requirements(ctx.spec)
