"""provenance.json: what exactly ran, copied with the evidence.

The project's git commit (taken by the bot when the run was submitted, since the copy a
node receives has no ``.git``; "not a git checkout" when there is none), the handler's (or
trainer's) source file and its SHA-256, and every input with its size and SHA-256, so a
result can be traced to the code and the data that produced it. Standard library only.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional

from runner.evidence import file_sha256
from runner.inputs import InputsError, list_inputs
from runner.spec import RunSpec

NAME = "provenance.json"
NOT_GIT = "not a git checkout"


def provenance(spec: RunSpec) -> Dict[str, Any]:
    try:
        inputs: Any = [{"id": it.id, "bytes": it.size, "sha256": file_sha256(it.path)}
                       for it in list_inputs(spec)]
    except (InputsError, OSError) as exc:
        inputs = f"cannot list or read the inputs: {exc}"
    return {"run": spec.run_id,
            "project": {"dir": spec.project.dir,
                        "git_commit": getattr(spec.project, "commit", None) or NOT_GIT},
            "code": _code(spec), "inputs": inputs}


def _code(spec: RunSpec) -> List[Dict[str, Any]]:
    out = []
    for field, ref in (("task.handler", spec.task.handler), ("task.trainer", spec.task.trainer)):
        if not ref:
            continue
        path = module_path(str(ref).split(":")[0], spec.project.dir)
        entry: Dict[str, Any] = {"field": field, "ref": ref, "file": path}
        if path is not None:
            try:
                entry["sha256"] = file_sha256(path)
            except OSError as exc:
                entry["error"] = str(exc)
        out.append(entry)
    return out


def module_path(module: str, project_dir: str) -> Optional[str]:
    """The source file of ``module``: in the project, else in the runner's own tree."""
    runner_root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    for root in (project_dir, runner_root):
        base = os.path.join(root, *module.split("."))
        for candidate in (base + ".py", os.path.join(base, "__init__.py")):
            if os.path.isfile(candidate):
                return os.path.abspath(candidate)
    return None
