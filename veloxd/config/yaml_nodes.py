"""YAML text -> plain data plus the line:column of every key and value (safe, bounded, YAML 1.2 scalars).

Scalars follow the YAML 1.2 core schema, as editors do: only true/false are booleans, so
`yes`, `on` and `no` stay strings (a boolean key given `yes` is an error, never a silent
conversion). Duplicate keys are errors. Aliases are expanded with a node budget and a
nesting limit, and the total characters of expanded scalars are bounded too, so alias bombs
(by count or by size) and deep nesting stop with a located error. `<<` merge keys work.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.composer import Composer
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from yaml.parser import Parser
from yaml.reader import Reader
from yaml.resolver import BaseResolver
from yaml.scanner import Scanner

MAX_NODES = 100_000  # values after alias expansion; a real veloxd.yaml has a few hundred
# Characters of scalars after alias expansion: a file is at most 1 MiB, so a document that grows
# past 4 Mi characters by aliasing big strings is a bomb by size (few values, huge ones).
MAX_CHARS = 4 << 20
MAX_DEPTH = 64

_TAG = "tag:yaml.org,2002:"
STR, INT, FLOAT, BOOL, NULL, MERGE = (_TAG + t for t in ("str", "int", "float", "bool", "null", "merge"))

Position = tuple[int, int]  # 1-based line, column


@dataclass(frozen=True)
class Span:
    """Where a value is written, and its key (None for the top level and list items)."""

    key: Position | None
    value: Position
    collection: bool = False  # a mapping or list: problems with it as a whole point at its key


@dataclass
class Parsed:
    data: Any
    spans: dict[tuple, Span] = field(default_factory=dict)
    problems: list[tuple[Position, tuple, str]] = field(default_factory=list)  # not fatal


class YamlProblem(Exception):
    """A problem that stops parsing (syntax, alias bomb, nesting)."""

    def __init__(self, position: Position, message: str, path: tuple = ()) -> None:
        super().__init__(message)
        self.position, self.message, self.path = position, message, path


class _Resolver(BaseResolver):
    """YAML 1.2 core schema (PyYAML's own resolver is YAML 1.1: yes/no/on/off, 0777 octal, 1:30 sexagesimal)."""


for _tag, _regexp, _first in (
    (BOOL, r"^(?:true|True|TRUE|false|False|FALSE)$", "tTfF"),
    (INT, r"^(?:[-+]?[0-9]+|0o[0-7]+|0x[0-9a-fA-F]+)$", "-+0123456789"),
    (
        FLOAT,
        r"^(?:[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)(?:[eE][-+]?[0-9]+)?"
        r"|[-+]?\.(?:inf|Inf|INF)|\.(?:nan|NaN|NAN))$",
        "-+.0123456789",
    ),
    (NULL, r"^(?:~|null|Null|NULL|)$", ["~", "n", "N", ""]),
    (MERGE, r"^<<$", "<"),
):
    _Resolver.add_implicit_resolver(_tag, re.compile(_regexp), list(_first))


class _Loader(Reader, Scanner, Parser, Composer, _Resolver):
    """PyYAML's composer (node tree with marks, no object construction) with a nesting limit."""

    def __init__(self, text: str) -> None:
        Reader.__init__(self, text)
        Scanner.__init__(self)
        Parser.__init__(self)
        Composer.__init__(self)
        _Resolver.__init__(self)
        self.depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node | None:
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YamlProblem((mark.line + 1, mark.column + 1), f"nesting deeper than {MAX_DEPTH} levels")
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


def parse(text: str) -> Parsed:
    """Compose and convert `text`; YamlProblem for fatal problems, `Parsed.problems` for the rest."""
    loader = None
    try:
        loader = _Loader(text)
        root = loader.get_single_node()
    except yaml.MarkedYAMLError as err:
        raise _syntax_problem(err) from None
    except yaml.reader.ReaderError as err:
        line = text.count("\n", 0, err.position) + 1
        column = err.position - (text.rfind("\n", 0, err.position) + 1) + 1
        raise YamlProblem((line, column), f"character U+{err.character:04X} is not allowed in YAML") from None
    finally:
        if loader is not None:
            loader.dispose()
    parsed = Parsed(data=None)
    if root is not None:
        parsed.data = _Converter(parsed).value(root, (), None)
    return parsed


def _position(node: Node) -> Position:
    return (node.start_mark.line + 1, node.start_mark.column + 1)


def _syntax_problem(err: yaml.MarkedYAMLError) -> YamlProblem:
    mark = err.problem_mark or err.context_mark
    position = (mark.line + 1, mark.column + 1) if mark else (1, 1)
    problem = err.problem or "invalid YAML"
    if "'\\t'" in problem:
        return YamlProblem(position, "tab character: YAML indents and separates with spaces only")
    if problem.startswith("but ") and err.context:  # "expected a single document ... but found another"
        return YamlProblem(position, f"YAML syntax error: {err.context} {problem}")
    context = ""
    if err.context and err.context_mark and err.context_mark is not mark:
        context = f" ({err.context} at line {err.context_mark.line + 1}, column {err.context_mark.column + 1})"
    elif err.context:
        context = f" ({err.context})"
    return YamlProblem(position, f"YAML syntax error: {problem}{context}")


class _Converter:
    """Nodes -> dict/list/scalars, recording spans; expands aliases within MAX_NODES."""

    def __init__(self, parsed: Parsed) -> None:
        self.parsed = parsed
        self.count = 0
        self.chars = 0
        self.active: set[int] = set()  # nodes being converted: a repeat is a recursive alias

    def problem(self, node: Node, path: tuple, message: str) -> None:
        self.parsed.problems.append((_position(node), path, message))

    def bomb(self, node: Node, path: tuple, limit: str) -> YamlProblem:
        """Aliases expanded past `limit`: reported at the top-level key they stand under."""
        where = self.parsed.spans.get(path[:1])
        position = where.key or where.value if where else _position(node)
        return YamlProblem(position, f"aliases expand to more than {limit} (an alias bomb?)", path[:1])

    def value(self, node: Node, path: tuple, key: Position | None) -> Any:
        self.count += 1
        if self.count > MAX_NODES:
            raise self.bomb(node, path, f"{MAX_NODES} values")
        if id(node) in self.active:
            raise YamlProblem(_position(node), "recursive alias: a value contains itself", path)
        self.parsed.spans[path] = Span(key, _position(node), not isinstance(node, ScalarNode))
        if isinstance(node, ScalarNode):
            self.chars += len(node.value)
            if self.chars > MAX_CHARS:
                raise self.bomb(node, path, f"{MAX_CHARS} characters")
            return self.scalar(node, path)
        self.active.add(id(node))
        try:
            if isinstance(node, SequenceNode):
                if node.tag != _TAG + "seq":
                    self.problem(node, path, f"unsupported tag '{_short(node.tag)}'")
                return [self.value(item, path + (i,), None) for i, item in enumerate(node.value)]
            assert isinstance(node, MappingNode)  # PyYAML composes scalars, sequences and mappings only
            if node.tag != _TAG + "map":
                self.problem(node, path, f"unsupported tag '{_short(node.tag)}'")
            return self.mapping(node, path)
        finally:
            self.active.discard(id(node))

    def mapping(self, node: MappingNode, path: tuple) -> dict[str, Any]:
        result: dict[str, Any] = {}
        first_line: dict[str, int] = {}
        for key_node, value_node, explicit in self.pairs(node, path):
            if not isinstance(key_node, ScalarNode):
                self.problem(key_node, path, "a key must be a plain name, not a list or mapping")
                continue
            name = key_node.value  # keys are text: `8080:` is the key "8080", as in JSON
            self.chars += len(name)
            if name in first_line:
                if explicit:
                    self.problem(
                        key_node, path + (name,), f"duplicate key '{name}' (first written at line {first_line[name]})"
                    )
                continue  # a merged key loses to an explicit one, and to an earlier merge source
            first_line[name] = _position(key_node)[0]
            result[name] = self.value(value_node, path + (name,), _position(key_node))
        return result

    def pairs(self, node: MappingNode, path: tuple) -> list[tuple[Node, Node, bool]]:
        """(key, value, explicit) of a mapping: its own pairs first, then those of its `<<` sources."""
        self.count += len(node.value)
        if self.count > MAX_NODES:
            raise YamlProblem(_position(node), f"merges expand to more than {MAX_NODES} values", path)
        own = [(k, v, True) for k, v in node.value if not (isinstance(k, ScalarNode) and k.tag == MERGE)]
        merged: list[tuple[Node, Node, bool]] = []
        first_merge: int | None = None
        for key_node, value_node in node.value:
            if not (isinstance(key_node, ScalarNode) and key_node.tag == MERGE):
                continue
            if first_merge is not None:  # a duplicate key like any other; still merged, so no error follows from it
                self.problem(
                    key_node,
                    path,
                    f"duplicate key '<<' (first written at line {first_merge}): merge several mappings "
                    "with one '<<: [*a, *b]'",
                )
            first_merge = first_merge or _position(key_node)[0]
            for source in value_node.value if isinstance(value_node, SequenceNode) else [value_node]:
                if not isinstance(source, MappingNode):
                    self.problem(source, path, "'<<' merges a mapping or a list of mappings")
                    continue
                if id(source) in self.active:
                    raise YamlProblem(_position(source), "recursive alias: a mapping merges itself", path)
                self.active.add(id(source))
                try:
                    merged += [(k, v, False) for k, v, _ in self.pairs(source, path)]
                finally:
                    self.active.discard(id(source))
        return own + merged

    def scalar(self, node: ScalarNode, path: tuple) -> Any:
        text, tag = node.value, node.tag
        if tag == STR:
            return text
        try:
            if tag == NULL and text in ("", "~", "null", "Null", "NULL"):
                return None
            if tag == BOOL and text.lower() in ("true", "false"):
                return text.lower() == "true"
            if tag == INT:
                sign, digits = (-1, text[1:]) if text.startswith("-") else (1, text.lstrip("+"))
                base = {"0o": 8, "0x": 16}.get(digits[:2].lower(), 10)
                return sign * int(digits[2:] if base != 10 else digits, base)
            if tag == FLOAT:
                number = _float(text)
                if math.isnan(number):
                    self.problem(node, path, "NaN is not allowed")
                return number
        except ValueError:
            pass
        if tag in (NULL, BOOL, INT, FLOAT):
            self.problem(node, path, f"'{text}' is not a valid {tag[len(_TAG) :]}")
        else:
            self.problem(node, path, f"unsupported tag '{_short(tag)}'")
        return text


def _float(text: str) -> float:
    lowered = text.lower()
    if lowered.lstrip("+-") == ".inf":
        return -math.inf if lowered.startswith("-") else math.inf
    if lowered == ".nan":
        return math.nan
    return float(text)


def _short(tag: str) -> str:
    return "!!" + tag[len(_TAG) :] if tag.startswith(_TAG) else tag
