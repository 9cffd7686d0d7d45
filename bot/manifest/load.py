"""Load a pilot manifest (YAML or JSON) and report every problem with its path and line.

``load_manifest`` is the one entry point: it parses with line numbers, validates with the
pydantic models of ``bot.manifest.model``, runs the rules of ``bot.manifest.rules``
(catalog, input files, success criteria, secrets) and raises one ``ManifestError`` listing
all problems of the file, or returns a ``LoadedManifest`` with the warnings. A submission is
read once: the ``LoadedManifest`` keeps the parsed data and source map and the inputs
folders as the rules listed them, and its readers (the policy, the project check, the
expected ids, the record the dispatch re-checks) use those instead of reading again.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from functools import cache
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, TypeAdapter, ValidationError

from bot.errors import ManifestError, ManifestUnreadable, Problem
from bot.manifest.catalog import Catalog, default_catalog
from bot.manifest.model import (
    API_VERSION,
    Approvals,
    Blender,
    Diagnostics,
    Hardware,
    Inputs,
    Lease,
    Manifest,
    Project,
    Results,
    Success,
    Task,
    Volume,
    VolumeInputs,
)
from bot.manifest.nodes import NODE_MODELS, NodeSpec
from bot.manifest.rules import (
    InputFile,
    InputListing,
    Listings,
    Parts,
    Report,
    check_rules,
    list_folder,
)
from bot.manifest.source import DOCUMENT, MAX_BYTES, SourceError, SourceMap, parse_text

__all__ = ["API_VERSION", "InputFile", "InputListing", "LoadedManifest", "Manifest",
           "ParsedText", "load_manifest", "load_manifest_file", "manifest_json_schema",
           "parse_manifest"]

_SECTIONS: dict[tuple[str, ...], type[BaseModel]] = {
    (): Manifest, ("hardware",): Hardware, ("node",): NodeSpec, ("project",): Project,
    ("inputs",): Inputs, ("task",): Task, ("diagnostics",): Diagnostics,
    ("success",): Success, ("results",): Results, ("approvals",): Approvals,
    ("lease",): Lease, ("volume",): Volume, ("volume", "inputs"): VolumeInputs,
    ("blender",): Blender,
}

_PATTERN_HELP = {
    "name": "a lower-case slug (a-z, 0-9, '.', '_', '-'; starts with a letter or digit; "
            "at most 63 characters)",
    "handler": 'an entry point "module:function" (e.g. runner.workloads.classify:handle)',
    "checks": 'entry points "module:function"',
    "host_key_fingerprint": 'a pin as printed by `ssh-keygen -lf`: "SHA256:" and 43 '
                            "base64 characters",
}


@dataclass(frozen=True)
class ParsedText:
    """A manifest's text parsed once: its data and where each value stands (a repeated key
    is listed in ``marks.duplicates``, its last value kept)."""

    text: str
    data: Any
    marks: SourceMap


def parse_manifest(text: str, *, source: str) -> ParsedText:
    """Parse ``text`` with line numbers; ManifestUnreadable (with where) when it cannot be."""
    try:
        data, marks = parse_text(text, keep_duplicates=True)
    except SourceError as exc:
        raise ManifestUnreadable(exc.problems, source=source) from exc
    return ParsedText(text, data, marks)


@dataclass(frozen=True)
class LoadedManifest:
    """A valid manifest with the text it came from and where relative paths start; ``data``
    and ``marks``: the text as parsed, ``listed``: its inputs folders as listed."""

    manifest: Manifest
    text: str
    source: str
    base_dir: Path
    warnings: list[Problem]
    data: Any = field(repr=False, compare=False)
    marks: SourceMap = field(repr=False, compare=False)
    listed: Listings = field(default_factory=Listings, repr=False, compare=False)

    @property
    def project_dir(self) -> Path:
        return (self.base_dir / self.manifest.project.dir).resolve()

    @property
    def inputs_dir(self) -> Path:
        return (self.project_dir / self.manifest.inputs.dir).resolve()

    def input_files(self) -> list[InputFile]:
        """The pilot inputs as listed when the manifest was loaded, sorted by id (ids: file
        names without extension)."""
        return self.listing().inputs

    def listing(self, inputs: Inputs | VolumeInputs | None = None) -> InputListing:
        """The folder of ``inputs`` (the pilot's when None; the volume's) as the rules listed
        it when the manifest was loaded; one they could not list is listed now (InputsError
        when it still cannot be)."""
        m = self.manifest
        section = inputs if inputs is not None else m.inputs
        listed = self.listed.inputs if section == m.inputs else \
            self.listed.volume if m.volume is not None and section == m.volume.inputs else None
        if listed is not None:
            return listed
        if section.dir is None:  # a corpus only the nodes hold: listed there, at dispatch
            return InputListing(self.project_dir, [], [])
        return list_folder((self.project_dir / section.dir).resolve(), section.pattern,
                           section.frames)


def load_manifest(text: str, *, source: str, base_dir: Path,
                  catalog: Catalog | None = None,
                  parsed: ParsedText | None = None,
                  bot_places: Sequence[tuple[str, Path]] = (),
                  validated: Manifest | None = None) -> LoadedManifest:
    """Parse and check ``text``; raise ManifestError listing every problem found.
    ``parsed``: ``text`` already parsed (``parse_manifest``), so it is not parsed again.
    ``bot_places``: the bot's own folders (what, path), which no evidence copy may touch.
    ``validated``: the model of ``text`` already validated (a stored run's): it is not
    validated again, while the rules (the files it names, as they are now) run again."""
    if parsed is None or parsed.text != text:
        parsed = parse_manifest(text, source=source)
    data, source_map = parsed.data, parsed.marks
    if not isinstance(data, dict):
        line, column = source_map.locate(())
        raise ManifestError([Problem(DOCUMENT, "expected a mapping of sections (apiVersion, "
                                     f"name, hardware, ...), found {_kind(data)}", line,
                                     column)], source=source)
    report = Report(source_map)
    report.errors += source_map.duplicates  # reported beside every other problem
    manifest, parts = _validate(data, report, validated)
    listed = check_rules(parts, data, base_dir=Path(base_dir),
                         catalog=catalog or default_catalog(), report=report,
                         bot_places=bot_places)
    report.errors.sort(key=_by_line)
    report.warnings.sort(key=_by_line)
    if report.errors or manifest is None:
        raise ManifestError(report.errors, source=source, warnings=report.warnings)
    return LoadedManifest(manifest=manifest, text=text, source=source,
                          base_dir=Path(base_dir).resolve(), warnings=report.warnings,
                          data=data, marks=source_map, listed=listed)


def load_manifest_file(path: Path | str, *, catalog: Catalog | None = None) -> LoadedManifest:
    """Read and load a manifest file; ManifestUnreadable when the file cannot be read."""
    file = Path(path)
    try:
        with file.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)  # beyond the cap, parse_text refuses it
    except OSError as exc:
        raise ManifestUnreadable([Problem(DOCUMENT, f"cannot read {file}: "
                                          f"{exc.strerror or exc}")], source=str(file)) from exc
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ManifestUnreadable([Problem(DOCUMENT, f"not UTF-8 text (byte {exc.start})",
                                          line, 1)], source=str(file)) from exc
    return load_manifest(text, source=str(file), base_dir=file.resolve().parent,
                         catalog=catalog)


def manifest_json_schema() -> dict[str, Any]:
    """The JSON Schema of the manifest (for editors and the YAML language server)."""
    schema = Manifest.model_json_schema(by_alias=True)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema",
            "$id": "https://preflight.invalid/schema/manifest-v1.json", **schema}


def _validate(data: dict[str, Any], report: Report,
              validated: Manifest | None = None) -> tuple[Manifest | None, Parts]:
    manifest: Manifest | None = validated
    try:
        if manifest is None:
            manifest = Manifest.model_validate(data)
    except ValidationError as exc:
        bad: set[str] = set()
        for error in exc.errors(include_url=False):
            loc = error["loc"]
            bad.add(str(loc[0]) if loc else "")
            _report_error(error, report)
        parts = _partial_parts(data, bad)
    else:
        parts = Parts(**{f.name: getattr(manifest, f.name) for f in fields(Parts)
                         if hasattr(manifest, f.name)})
    hardware = data.get("hardware")
    if isinstance(hardware, dict) and isinstance(hardware.get("gpu"), str):
        parts.gpu_name = hardware["gpu"]
    return manifest, parts


def _report_error(error: Any, report: Report) -> None:
    loc = tuple(error["loc"])
    kind = error["type"]
    shown = (error.get("ctx") or {}).get("class_name")
    if kind == "model_type" and shown in {NodeSpec.__name__,
                                          *(m.__name__ for m in NODE_MODELS.values())}:
        error = {**error, "msg": str(error["msg"]).replace(shown, "Node")}  # not one kind's
    if kind == "node_kind":  # the node union's tag: said of the section's own ``kind``
        given = error.get("input")
        loc, error = (*loc, "kind"), {**error, "input": given.get("kind")
                                      if isinstance(given, dict) else given}
    if kind == "string_pattern_mismatch" and _last_name(loc) in _PATTERN_HELP:
        message = f"expected {_PATTERN_HELP[_last_name(loc)]}; found {_show(error.get('input'))}"
    elif kind == "extra_forbidden":
        message = f"unknown key {str(loc[-1])!r}" + _suggest(loc)
    elif kind == "missing":
        message = f"missing required field {str(loc[-1])!r}"
    else:
        text = str(error["msg"]).removeprefix("Value error, ")
        message = f"{text[:1].lower()}{text[1:]}; found {_show(error.get('input'))}"
    report.problem(loc, message)


def _last_name(loc: tuple[Any, ...]) -> str:
    names = [p for p in loc if isinstance(p, str)]
    return names[-1] if names else ""


def _suggest(loc: tuple[Any, ...]) -> str:
    # a union's tag (``node[ssh]``) is no section of the document
    model = _SECTIONS.get(tuple(str(p) for p in loc[:-1]
                                if not (isinstance(p, str) and p.endswith("]"))))
    if model is None:
        return ""
    known = [f.alias or name for name, f in model.model_fields.items()]
    close = difflib.get_close_matches(str(loc[-1]), known, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    return f"{hint}; expected one of: {', '.join(known)}"


def _partial_parts(data: dict[str, Any], bad: set[str]) -> Parts:
    values: dict[str, Any] = {}
    for f in fields(Parts):
        if f.name in bad or f.name not in Manifest.model_fields:
            continue
        try:
            values[f.name] = _adapter(f.name).validate_python(data[f.name]) \
                if f.name in data else Manifest.model_fields[f.name].get_default(
                    call_default_factory=True)
        except ValidationError:
            continue
    return Parts(**values)


@cache
def _adapter(name: str) -> TypeAdapter[Any]:
    info = Manifest.model_fields[name]
    return TypeAdapter(Annotated[info.annotation, info])  # type: ignore[arg-type]


def _by_line(problem: Problem) -> tuple[int, int]:
    return problem.line or 0, problem.column or 0


def _show(value: Any) -> str:
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _kind(value: Any) -> str:
    names: dict[type, str] = {dict: "a mapping", list: "a list", str: "text"}
    return names.get(type(value), repr(value))

