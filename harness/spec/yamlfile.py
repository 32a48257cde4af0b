"""Safe YAML reading for case files, with the line of every field.

The text is composed into a node tree first (no Python objects are built), the tree is checked
(no ``!!python/...`` tags, no duplicate keys) and indexed (field path -> 1-based line), and only
then constructed with PyYAML's ``SafeConstructor``. Nothing in a case file is ever executed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Optional

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from harness.errors import CaseError
from harness.spec.problems import Loc

PYTHON_TAG_PREFIX = "tag:yaml.org,2002:python/"
# Aliases let a few lines expand into billions of values; no case file comes near this.
MAX_EXPANDED_VALUES = 100_000
MERGE_TAG = "tag:yaml.org,2002:merge"
STR_TAG = "tag:yaml.org,2002:str"


class CaseYamlLoader(yaml.SafeLoader):
    """PyYAML's safe loader; used only through compose + ``construct_document``."""


@dataclass(frozen=True)
class ParsedYaml:
    """A YAML document as plain data plus the line (1-based) of each field path in it."""

    data: Any
    lines: Mapping[Loc, int]

    def line_of(self, loc: Loc) -> Optional[int]:
        """Line of ``loc`` or of its nearest ancestor present in the file (None at top level)."""
        for end in range(len(loc), 0, -1):
            line = self.lines.get(tuple(loc[:end]))
            if line is not None:
                return line
        return None


def parse_case_yaml(text: str, file: str) -> ParsedYaml:
    """Parse one case document safely; raise ``CaseError`` (with the line) on any problem."""
    loader = CaseYamlLoader(text)
    try:
        try:
            root = loader.get_single_node()
        except yaml.MarkedYAMLError as exc:
            raise _syntax_error(exc, file) from None
        if root is None:
            raise CaseError(
                "the file holds no YAML document; a case file is one mapping (name:, train:, ...)",
                file=file,
            )
        lines: dict[Loc, int] = {}
        _index(root, (), lines, set(), file, merged=False)
        if _expanded_size(root, {}) > MAX_EXPANDED_VALUES:
            raise CaseError(
                f"the document expands to more than {MAX_EXPANDED_VALUES} values through "
                "YAML aliases (&anchor / *alias); write the values out instead",
                file=file, line=_line(root))
        try:
            data = loader.construct_document(root)
        except yaml.MarkedYAMLError as exc:
            raise _syntax_error(exc, file) from None
    finally:
        loader.dispose()
    return ParsedYaml(data=data, lines=lines)


def _syntax_error(exc: yaml.MarkedYAMLError, file: str) -> CaseError:
    mark = exc.problem_mark or exc.context_mark
    line = mark.line + 1 if mark is not None else None
    problem = exc.problem or "cannot parse"
    detail = ""
    if exc.context:
        detail = f" ({exc.context}"
        start = exc.context_mark
        if start is not None and mark is not None and start.line != mark.line:
            detail += f" that starts at line {start.line + 1}"
        detail += ")"
    return CaseError(f"invalid YAML: {problem}{detail}", file=file, line=line)


def _line(node: Node) -> int:
    return node.start_mark.line + 1


def _check_tag(node: Node, path: Loc, file: str) -> None:
    if node.tag.startswith(PYTHON_TAG_PREFIX):
        short = "!!" + node.tag[len("tag:yaml.org,2002:") :]
        raise CaseError(
            f"the tag '{short}' is not allowed: case files are read with a safe YAML loader "
            "and never build Python objects; write plain values instead",
            file=file,
            field=".".join(str(p) for p in path) or None,
            line=_line(node),
        )


def _expanded_size(node: Node, memo: dict[int, int]) -> int:
    """How many values the node stands for once aliases are expanded (memoized per node)."""
    known = memo.get(id(node))
    if known is not None:
        return known
    memo[id(node)] = 1  # a node that reaches itself counts once (recursion guard)
    total = 1
    if isinstance(node, MappingNode):
        for key_node, value_node in node.value:
            total += _expanded_size(key_node, memo) + _expanded_size(value_node, memo)
            if total > MAX_EXPANDED_VALUES:
                break
    elif isinstance(node, SequenceNode):
        for item in node.value:
            total += _expanded_size(item, memo)
            if total > MAX_EXPANDED_VALUES:
                break
    memo[id(node)] = total
    return total


def _index(node: Node, path: Loc, lines: dict[Loc, int], seen: set[int], file: str,
           merged: bool) -> None:
    """Check tags and duplicate keys, and record the line of every field path below ``node``.

    Each node is walked once (aliases share nodes), so an alias bomb costs linear time.
    ``merged`` marks content pulled in by a ``<<`` merge key: it never overrides explicit keys.
    """
    _check_tag(node, path, file)
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, MappingNode):
        first_line: dict[tuple[str, str], int] = {}
        merges: list[Node] = []
        for key_node, value_node in node.value:
            _check_tag(key_node, path, file)
            if key_node.tag == MERGE_TAG:
                merges.append(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                raise CaseError(
                    "mapping keys must be plain names, not lists or mappings",
                    file=file,
                    field=".".join(str(p) for p in path) or None,
                    line=_line(key_node),
                )
            if key_node.tag != STR_TAG:
                kind = key_node.tag.rsplit(":", 1)[-1]
                raise CaseError(
                    f"key '{key_node.value}' is read as a YAML {kind}, not a name; case-file "
                    f"keys are field names (quote it if you mean the text '{key_node.value}')",
                    file=file,
                    field=".".join(str(p) for p in path) or None,
                    line=_line(key_node),
                )
            identity = (key_node.tag, key_node.value)
            child = path + (key_node.value,)
            if identity in first_line:
                raise CaseError(
                    f"duplicate key '{key_node.value}' (first given at line "
                    f"{first_line[identity]}); give each key once",
                    file=file,
                    field=".".join(str(p) for p in child),
                    line=_line(key_node),
                )
            first_line[identity] = _line(key_node)
            if merged:
                lines.setdefault(child, _line(key_node))
            else:
                lines[child] = _line(key_node)
            _index(value_node, child, lines, seen, file, merged)
        for merge in merges:
            targets = merge.value if isinstance(merge, SequenceNode) else [merge]
            for target in targets:
                _index(target, path, lines, seen, file, merged=True)
    elif isinstance(node, SequenceNode):
        for index, item in enumerate(node.value):
            child = path + (index,)
            if merged:
                lines.setdefault(child, _line(item))
            else:
                lines[child] = _line(item)
            _index(item, child, lines, seen, file, merged)
