"""Case selection: a pytest-style ``-k`` expression over case ids, and a tags filter.

``-k`` grammar: terms (substrings of the case id, case-insensitive) combined with ``and``,
``or``, ``not`` and parentheses; ``not`` binds tightest, then ``and``, then ``or``. An empty
expression selects everything.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Iterable, Optional, Sequence

from harness.errors import ConfigError
from harness.spec.schema import Case

_TOKEN = re.compile(r"\s*(\(|\)|[^\s()]+)")
_KEYWORDS = ("and", "or", "not")

Matcher = Callable[[str], bool]


@dataclass(frozen=True)
class _Token:
    text: str
    column: int  # 1-based


def _tokenize(expr: str) -> list[_Token]:
    tokens = []
    pos = 0
    while True:
        m = _TOKEN.match(expr, pos)
        if m is None:
            break
        tokens.append(_Token(m.group(1), m.start(1) + 1))
        pos = m.end()
    return tokens


class _Parser:
    def __init__(self, expr: str) -> None:
        self.expr = expr
        self.tokens = _tokenize(expr)
        self.pos = 0

    def error(self, what: str) -> ConfigError:
        column = self.tokens[self.pos].column if self.pos < len(self.tokens) else len(self.expr) + 1
        return ConfigError(f"invalid -k expression {self.expr!r}: {what} at column {column}")

    def peek(self) -> Optional[str]:
        return self.tokens[self.pos].text if self.pos < len(self.tokens) else None

    def take(self) -> str:
        text = self.tokens[self.pos].text
        self.pos += 1
        return text

    def parse(self) -> Matcher:
        matcher = self.parse_or()
        if self.peek() is not None:
            raise self.error(f"unexpected {self.peek()!r}")
        return matcher

    def parse_or(self) -> Matcher:
        parts = [self.parse_and()]
        while self.peek() == "or":
            self.take()
            parts.append(self.parse_and())
        if len(parts) == 1:
            return parts[0]
        return lambda text: any(p(text) for p in parts)

    def parse_and(self) -> Matcher:
        parts = [self.parse_not()]
        while self.peek() == "and":
            self.take()
            parts.append(self.parse_not())
        if len(parts) == 1:
            return parts[0]
        return lambda text: all(p(text) for p in parts)

    def parse_not(self) -> Matcher:
        if self.peek() == "not":
            self.take()
            inner = self.parse_not()
            return lambda text: not inner(text)
        return self.parse_primary()

    def parse_primary(self) -> Matcher:
        token = self.peek()
        if token is None:
            raise self.error("expected a term")
        if token == "(":
            self.take()
            inner = self.parse_or()
            if self.peek() != ")":
                raise self.error("expected ')'")
            self.take()
            return inner
        if token == ")" or token in _KEYWORDS:
            raise self.error(f"expected a term, got {token!r}")
        term = self.take().lower()
        return lambda text: term in text


def compile_k(expr: Optional[str]) -> Matcher:
    """A predicate on case ids for a ``-k`` expression (raises ConfigError when malformed)."""
    if expr is None or not expr.strip():
        return lambda text: True
    matcher = _Parser(expr).parse()
    return lambda text: matcher(text.lower())


def _split_tags(tags: Iterable[str]) -> set[str]:
    return {t.strip() for tag in tags for t in tag.split(",") if t.strip()}


def select_cases(cases: Sequence[Case], k: Optional[str] = None,
                 tags: Optional[Iterable[str]] = None) -> list[Case]:
    """The cases whose id matches ``k`` and that carry any of ``tags`` (order kept).

    ``tags`` entries may be comma-separated; None or no tags means no tag filter.
    """
    matches = compile_k(k)
    wanted = _split_tags(tags or ())
    return [
        case for case in cases
        if matches(case.id) and (not wanted or wanted.intersection(case.tags))
    ]
