"""The field types every section of the manifest is made of (``model.py``, ``nodes.py``)."""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, Strict

NonEmpty = Annotated[str, Field(min_length=1)]
# Strict: a YAML `yes`/`true` or a quoted "3" is not silently taken for a count of 1 or 3
# (pydantic's lax mode would turn `lots: yes` into one lot); an int is still a valid Number.
Int = Annotated[int, Strict()]
Number = Annotated[float, Strict()]


class Section(BaseModel):
    """A section of the manifest: unknown keys are errors, a parsed one never changes."""

    model_config = ConfigDict(extra="forbid", frozen=True)
