"""Read manifest text (YAML or JSON) into plain data plus a map from field path to line.

The text is composed once into PyYAML's node tree, which keeps the line and column of
every key and item; the data is constructed from that same tree. Errors found later
(pydantic, rules, secrets) are located with ``SourceMap.locate`` on their field path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import yaml

from bot.errors import Problem

FieldPath = tuple[str | int, ...]
DOCUMENT = "(document)"
MAX_BYTES = 256 * 1024  # a manifest's text; it is stored with every run
MAX_ALIASES = 100  # alias uses (``*name``) in one document
MAX_ALIAS_VALUES = 10_000  # values that aliases add, all together, when expanded
_MERGE_TAG = "tag:yaml.org,2002:merge"
_NUMBER_TAGS = frozenset({"tag:yaml.org,2002:float", "tag:yaml.org,2002:int"})
_LoaderBase: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class _Loader(_LoaderBase):  # type: ignore[misc]
    """Safe loader that leaves timestamps as text: pydantic parses them and reports a bad
    date with its field path instead of a bare ValueError from the YAML constructor."""


_Loader.add_constructor("tag:yaml.org,2002:timestamp",
                        lambda loader, node: loader.construct_scalar(node))


class SourceError(Exception):
    def __init__(self, problems: list[Problem]) -> None:
        super().__init__("; ".join(str(p) for p in problems))
        self.problems = problems


@dataclass
class SourceMap:
    """Line/column (1-based) of each key or list item, by field path."""

    marks: dict[FieldPath, tuple[int, int]] = field(default_factory=dict)
    kinds: dict[FieldPath, str] = field(default_factory=dict)
    duplicates: list[Problem] = field(default_factory=list)

    def resolve(self, loc: Sequence[Any]) -> tuple[FieldPath, FieldPath]:
        """Split ``loc`` into the deepest existing path and the remaining elements.

        Elements that pydantic inserts (union tags such as ``list[str]``) are skipped.
        """
        found: FieldPath = ()
        rest: list[str | int] = []
        for element in loc:
            kind = self.kinds.get(found)
            if rest:
                rest.append(element)
                continue
            if kind == "seq" and isinstance(element, int) and (*found, element) in self.marks:
                found = (*found, element)
            elif kind == "map" and (*found, str(element)) in self.marks:
                found = (*found, str(element))
            elif _is_tag(element):
                continue
            else:
                rest.append(element)
        return found, tuple(rest)

    def locate(self, loc: Sequence[Any]) -> tuple[int | None, int | None]:
        """Line and column of the closest existing node along ``loc``."""
        found, _ = self.resolve(loc)
        return self.marks.get(found, (None, None))


def format_loc(loc: Sequence[Any]) -> str:
    """``("inputs", "expected_refusals", 0)`` -> ``inputs.expected_refusals[0]``."""
    out = ""
    for element in loc:
        if isinstance(element, int):
            out += f"[{element}]"
        elif not _is_tag(element):
            # An empty key is still a place: shown as '' so the path never reads as nothing.
            out += ("." if out else "") + (str(element) or "''")
    return out


def _is_tag(element: Any) -> bool:
    return isinstance(element, str) and any(c in element for c in "[]()")


def parse_text(text: str, *, keep_duplicates: bool = False,
               max_bytes: int = MAX_BYTES) -> tuple[Any, SourceMap]:
    """Data and source map of ``text``; SourceError with located problems when unparsable.

    A repeated key raises too, unless ``keep_duplicates``: then each one is listed in
    ``SourceMap.duplicates`` (the last value is kept) so the caller reports it beside every
    other problem of the document instead of hiding them. Text over ``max_bytes`` and alias
    bombs (``MAX_ALIASES``, ``MAX_ALIAS_VALUES``) are refused before anything is built.
    """
    text = text.lstrip("\ufeff")
    if text.lstrip().startswith("{"):
        # JSON is YAML, except that YAML refuses tabs as indentation; JSON strings cannot
        # hold a raw tab, so replacing them changes nothing but whitespace.
        text = text.replace("\t", " ")
    size = len(text.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        raise SourceError([Problem(DOCUMENT, f"the text is {size // 1024} KiB, more than the "
                                   f"{max_bytes // 1024} KiB that may be read", 1, 1)])
    try:
        _check_aliases(text)
    except yaml.YAMLError as exc:
        raise SourceError([_yaml_problem(exc, text)]) from exc
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SourceError([Problem(DOCUMENT, "the manifest is empty", 1, 1)])
        source = SourceMap()
        duplicates: list[Problem] = []
        _index(node, (), source, set(), duplicates)
        if duplicates and not keep_duplicates:
            raise SourceError(duplicates)
        source.duplicates = duplicates
        data = _construct(loader, node)
        _keep_price_text(node, data)
    except yaml.YAMLError as exc:
        raise SourceError([_yaml_problem(exc, text)]) from exc
    except RecursionError as exc:
        raise SourceError([Problem(DOCUMENT, "nested too deeply to be a manifest", 1, 1)]) from exc
    finally:
        loader.dispose()
    return data, source


def _construct(loader: Any, root: yaml.Node) -> Any:
    """Build the data; a scalar its tag cannot hold (``!!int abc``) is located, not raised."""
    try:
        return loader.construct_document(root)
    except (ValueError, TypeError, OverflowError, ArithmeticError, LookupError) as exc:
        for node in _scalars(root, set()):
            loader.constructed_objects, loader.recursive_objects = {}, {}
            try:
                loader.construct_object(node, deep=True)
            except (ValueError, TypeError, OverflowError, ArithmeticError, LookupError):
                line, column = _mark(node)
                raise SourceError([Problem(DOCUMENT, f"{node.value!r} cannot be read as "
                                           f"{node.tag.rsplit(':', 1)[-1]}", line, column)]
                                  ) from exc
        raise SourceError([Problem(DOCUMENT, f"a value cannot be read: {exc}", 1, 1)]) from exc


def _scalars(node: yaml.Node, seen: set[int]) -> list[yaml.Node]:
    if id(node) in seen:
        return []
    seen.add(id(node))
    if isinstance(node, yaml.ScalarNode):
        return [node]
    children = [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) \
        else list(node.value)
    return [s for child in children for s in _scalars(child, seen)]


def _mark(node: yaml.Node) -> tuple[int, int]:
    return node.start_mark.line + 1, node.start_mark.column + 1


def _index(node: yaml.Node, path: FieldPath, source: SourceMap, seen: set[int],
           duplicates: list[Problem]) -> None:
    """Record the mark of every key and item; each repeated key goes into ``duplicates``."""
    if id(node) in seen:
        return  # an alias: its paths fall back to the alias's own line
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        source.kinds[path] = "map"
        keys: set[str] = set()
        for key_node, value_node in node.value:
            if key_node.tag == _MERGE_TAG or not isinstance(key_node, yaml.ScalarNode):
                continue
            key = str(key_node.value)
            if key in keys:
                line, column = _mark(key_node)
                first = source.marks.get((*path, key), (None, None))[0]
                duplicates.append(Problem(format_loc((*path, key)),
                                          f"duplicate key {key!r} (first at line {first}): "
                                          "each key appears once", line, column))
                continue
            keys.add(key)
            source.marks[(*path, key)] = _mark(key_node)
            _index(value_node, (*path, key), source, seen, duplicates)
    elif isinstance(node, yaml.SequenceNode):
        source.kinds[path] = "seq"
        for index, item in enumerate(node.value):
            source.marks[(*path, index)] = _mark(item)
            _index(item, (*path, index), source, seen, duplicates)
    if not path:
        source.marks[()] = _mark(node)


def _check_aliases(text: str) -> None:
    """Refuse an alias bomb from the parser's events, before any node is built: more than
    MAX_ALIASES aliases, aliases that expand to more than MAX_ALIAS_VALUES values, or an
    alias inside the very collection it names. The problem names the alias's line."""
    sizes: dict[str, int] = {}  # anchor -> values it stands for
    stack: list[list[Any]] = []  # open collections: [anchor, values so far]
    aliases = added = 0
    for event in yaml.parse(text, Loader=_LoaderBase):
        if isinstance(event, yaml.CollectionStartEvent):
            stack.append([event.anchor, 1])
            continue
        if isinstance(event, yaml.CollectionEndEvent):
            anchor, count = stack.pop()
        elif isinstance(event, yaml.ScalarEvent):
            anchor, count = event.anchor, 1
        elif isinstance(event, yaml.AliasEvent):
            line, column = event.start_mark.line + 1, event.start_mark.column + 1
            aliases += 1
            if any(open_anchor == event.anchor for open_anchor, _ in stack):
                raise SourceError([Problem(DOCUMENT, f"the YAML alias *{event.anchor} refers "
                                           "to itself (it is inside the value it names)",
                                           line, column)])
            anchor, count = None, sizes.get(str(event.anchor), 1)
            added += count
            if aliases > MAX_ALIASES or added > MAX_ALIAS_VALUES:
                raise SourceError([Problem(DOCUMENT, "the YAML aliases expand too far: a "
                                           f"manifest may use {MAX_ALIASES} aliases standing"
                                           f" for {MAX_ALIAS_VALUES} values in all; write "
                                           "the values out", line, column)])
        else:
            continue
        if anchor is not None:
            sizes[anchor] = count
        if stack:
            stack[-1][1] += count


def _child(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.value == key:
                return value_node
    return None


def _keep_price_text(root: yaml.Node, data: Any) -> None:
    """Keep the price as written (``2.10``, not the float 2.1000000000000001)."""
    hardware = _child(root, "hardware")
    price = _child(hardware, "lot_price_usd_per_day") if hardware is not None else None
    if (isinstance(price, yaml.ScalarNode) and price.tag in _NUMBER_TAGS
            and isinstance(data, dict) and isinstance(data.get("hardware"), dict)):
        data["hardware"]["lot_price_usd_per_day"] = price.value


def _yaml_problem(exc: yaml.YAMLError, text: str) -> Problem:
    mark = getattr(exc, "problem_mark", None) or getattr(exc, "context_mark", None)
    if mark is not None:
        line, column = mark.line + 1, mark.column + 1
    else:
        position = getattr(exc, "position", 0) or 0
        line = text.count("\n", 0, position) + 1
        column = position - (text.rfind("\n", 0, position) + 1) + 1
    what = " ".join(str(p) for p in (getattr(exc, "context", None), getattr(exc, "problem", None))
                    if p) or str(exc).splitlines()[0]
    return Problem(DOCUMENT, f"not valid YAML or JSON: {what}", line, column)
