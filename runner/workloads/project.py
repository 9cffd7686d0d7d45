"""A team's own module, imported the way it imports on their machine (project.dir first
on ``sys.path``); shared by the handler and the trainer loaders. Standard library only."""

from __future__ import annotations

import importlib
import os
import sys
from typing import Any, Optional, Type


def import_project_module(module_name: str, project_dir: Optional[str], what: str,
                          error: Type[Exception]) -> Any:
    """Import a user's module with ``project_dir`` first on ``sys.path``.

    A module that is missing or raises while importing becomes ``error`` naming ``what``.
    """
    if project_dir and os.path.isdir(project_dir):
        absdir = os.path.abspath(project_dir)
        if absdir not in sys.path:
            sys.path.insert(0, absdir)
    try:
        return importlib.import_module(module_name)
    except ImportError as exc:
        raise error(f"{what}: cannot import module {module_name!r}: {exc}") from exc
    except Exception as exc:
        raise error(f"{what}: importing module {module_name!r} raised "
                    f"{type(exc).__name__}: {exc}") from exc
