"""Small builders for manifest tests: a project with N inputs and a manifest beside it."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from bot.errors import ManifestError, Problem
from bot.manifest.load import LoadedManifest, load_manifest

BASE: dict[str, Any] = {
    "apiVersion": "preflight/v1",
    "name": "pilot-test",
    "purpose": "inference",
    "hardware": {"gpu": "H100", "lots": 1, "days": 7, "lot_price_usd_per_day": "2.50"},
    "backend": "cuda",
    "preparation": "pytorch",
    "project": {"dir": "."},
    "inputs": {"dir": "data/pilote", "pattern": "doc-*.txt", "expected_count": 12,
               "expected_refusals": ["doc-07"]},
    "task": {"kind": "classify", "handler": "runner.workloads.classify:handle",
             "categories": ["invoice", "contract", "support", "research"]},
    "success": {"min_accepted": 11, "max_refused": 1},
}


def make_project(root: Path, count: int = 12, *, names: list[str] | None = None) -> Path:
    """``root/data/pilote`` holding ``doc-01.txt`` ... (or the given file names)."""
    data = root / "data" / "pilote"
    data.mkdir(parents=True, exist_ok=True)
    for name in names if names is not None else [f"doc-{i:02d}.txt" for i in range(1, count + 1)]:
        (data / name).write_text(f"text of {name}\n", encoding="utf-8")
    return root


def merged(**sections: Any) -> dict[str, Any]:
    """BASE with whole sections replaced or keys set; a value of None deletes the key."""
    data = copy.deepcopy(BASE)
    for key, value in sections.items():
        if value is None:
            data.pop(key, None)
        elif isinstance(value, dict) and isinstance(data.get(key), dict):
            for sub, subvalue in value.items():
                if subvalue is None:
                    data[key].pop(sub, None)
                else:
                    data[key][sub] = subvalue
        else:
            data[key] = value
    return data


def dump(data: dict[str, Any]) -> str:
    return yaml.safe_dump(data, sort_keys=False)


def load(root: Path, text: str) -> LoadedManifest:
    return load_manifest(text, source="test.yaml", base_dir=root)


def problems(root: Path, text: str) -> list[Problem]:
    """The problems of ``text`` (fails the test when the manifest is valid)."""
    try:
        load(root, text)
    except ManifestError as exc:
        return exc.problems
    raise AssertionError("the manifest was accepted")


def locs(root: Path, text: str) -> dict[str, Problem]:
    return {p.loc: p for p in problems(root, text)}


def count_validations(monkeypatch: Any) -> list[str]:
    """Count every ``Manifest`` validation from now on, by its entry point
    (``model_validate``, ``model_validate_json``), and forget the stored manifests
    validated so far (as a bot just started): the list the counts go to."""
    from bot.manifest.model import Manifest
    from bot.pilot.record import forget_stored_manifests

    calls: list[str] = []
    for name in ("model_validate", "model_validate_json"):
        entry = getattr(Manifest, name).__func__

        def counted(cls: type[Manifest], *args: Any, _name: str = name, _entry: Any = entry,
                    **kwargs: Any) -> Manifest:
            if cls is Manifest:
                calls.append(_name)
            return _entry(cls, *args, **kwargs)  # type: ignore[no-any-return]

        monkeypatch.setattr(Manifest, name, classmethod(counted))
    forget_stored_manifests()
    return calls
