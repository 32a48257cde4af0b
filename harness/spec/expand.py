"""``matrix:`` expansion: one case file -> the cartesian product of its varied fields.

Matrix keys are dotted field paths of the case schema (``parallel.vpp``, ``train.seed``,
``compare.dcp_vs_fixed_cp.fixed_cp``); values are lists. Variants come out in a stable order:
the first key varies slowest, each key's values in the order written.

Case ids: ``<name>`` without a matrix, else ``<name>.<seg>.<seg>...`` with one segment per matrix
key in key order. A segment is the key's last path component followed by the value, e.g.
``vpp2``, ``dynamic_cp1-2`` (lists joined by ``-``), ``lr0.0003``; a value that starts with a
letter is joined with ``-`` (``deterministic-true``, ``preset-tiny``). When two keys share a last
component, the whole path with ``.`` replaced by ``_`` is used instead. Characters outside
``[a-z0-9._-]`` become ``_`` (values are lower-cased).
"""

from __future__ import annotations

import copy
import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from harness.spec.fieldpaths import resolve_dotted
from harness.spec.problems import Loc, Problem, ProblemError

_UNSAFE = re.compile(r"[^a-z0-9._-]+")
_FORBIDDEN_KEYS = ("name", "matrix")
# One file expanding past this is a typo (or a sweep to split), not something to build in memory.
MAX_VARIANTS = 10_000


@dataclass(frozen=True)
class Variant:
    """One point of the matrix: the case data with the point's values laid over the file's."""

    data: dict[str, Any]  # the case file without ``matrix:``, values applied
    values: tuple[tuple[str, Any], ...]  # (matrix key, value), in matrix key order
    indexes: tuple[int, ...]  # position of each value in its matrix list

    @property
    def matrix_values(self) -> dict[str, Any]:
        return dict(self.values)

    def value_loc(self, loc: Loc) -> Optional[Loc]:
        """Location in ``matrix:`` of the value that set ``loc`` (or an ancestor of it)."""
        for (key, _), index in zip(self.values, self.indexes):
            path = tuple(key.split("."))
            if tuple(str(p) for p in loc[: len(path)]) == path:
                return ("matrix", key, index)
        return None


def render_value(value: Any) -> str:
    """A matrix value as id text (lower-case, only ``[a-z0-9._-]``)."""
    if value is None:
        text = "none"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, (int, float)):
        text = repr(value)
    elif isinstance(value, (list, tuple)):
        text = "-".join(render_value(v) for v in value)
    elif isinstance(value, dict):
        text = "-".join(f"{k}{render_value(v)}" for k, v in value.items())
    else:
        text = str(value)
    return _UNSAFE.sub("_", text.lower())


def key_labels(keys: Sequence[str]) -> dict[str, str]:
    """The id label of each matrix key: its last component, or the full path when ambiguous."""
    leaves = [key.split(".")[-1] for key in keys]
    labels = {}
    for key, leaf in zip(keys, leaves):
        label = leaf if leaves.count(leaf) == 1 else key.replace(".", "_")
        labels[key] = _UNSAFE.sub("_", label.lower())
    return labels


def case_id(name: str, values: Sequence[tuple[str, Any]]) -> str:
    """The stable id of a case: ``name`` plus one segment per matrix value (see module doc)."""
    labels = key_labels([key for key, _ in values])
    segments = [name]
    for key, value in values:
        text = render_value(value)
        joiner = "-" if text[:1].isalpha() or not text else ""
        segments.append(f"{labels[key]}{joiner}{text}")
    return ".".join(segments)


def _check_matrix(matrix: Any) -> dict[str, list[Any]]:
    if not isinstance(matrix, dict) or not matrix:
        raise ProblemError(
            Problem(("matrix",), "matrix must map dotted field paths to lists of values, "
                                 "e.g. {parallel.vpp: [1, 2]}")
        )
    keys = list(matrix)
    for key, values in matrix.items():
        loc: Loc = ("matrix", key)
        if not isinstance(key, str):
            raise ProblemError(Problem(loc, "matrix keys must be dotted field paths"))
        if key.split(".")[0] in _FORBIDDEN_KEYS:
            raise ProblemError(
                Problem(loc, f"'{key}' cannot be varied: the name gives the case ids and "
                             "matrices do not nest")
            )
        why = resolve_dotted(key)
        if why is not None:
            raise ProblemError(Problem(loc, f"unknown field path '{key}': {why}"))
        for other in keys:
            if other != key and other.startswith(key + "."):
                raise ProblemError(
                    Problem(loc, f"'{key}' and '{other}' overlap; vary one or the other")
                )
        if not isinstance(values, list):
            raise ProblemError(
                Problem(loc, f"'{key}' must list the values to try, e.g. [1, 2] "
                             f"(got {values!r})")
            )
        if not values:
            raise ProblemError(Problem(loc, f"'{key}' lists no values"))
    sizes = [len(values) for values in matrix.values()]
    if math.prod(sizes) > MAX_VARIANTS:
        raise ProblemError(
            Problem(("matrix",), f"expands to {math.prod(sizes)} cases "
                                 f"({' x '.join(map(str, sizes))}), more than {MAX_VARIANTS}; "
                                 "split it over several files")
        )
    return matrix


def _set_path(data: dict[str, Any], key: str, value: Any) -> None:
    parts = key.split(".")
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            raise ProblemError(
                Problem(tuple(parts[: depth + 1]),
                        f"matrix key '{key}' needs '{where}' to be a mapping, "
                        f"not {child!r}")
            )
        node = child
    node[parts[-1]] = copy.deepcopy(value)


def expand_matrix(raw: Mapping[str, Any]) -> list[Variant]:
    """Every variant of one case file's data (a single variant when there is no matrix).

    Raises ProblemError for a malformed matrix (unknown field path, empty list, ...).
    """
    base = {k: v for k, v in raw.items() if k != "matrix"}
    matrix = raw.get("matrix")
    if matrix is None:
        return [Variant(data=copy.deepcopy(base), values=(), indexes=())]
    matrix = _check_matrix(matrix)
    keys = list(matrix)
    variants = []
    for indexes in itertools.product(*(range(len(matrix[k])) for k in keys)):
        data = copy.deepcopy(base)
        values = tuple((key, matrix[key][i]) for key, i in zip(keys, indexes))
        for key, value in values:
            _set_path(data, key, value)
        variants.append(Variant(data=data, values=values, indexes=tuple(indexes)))
    return variants


def check_unique_ids(name: str, variants: Sequence[Variant]) -> None:
    """Raise when two matrix points render to the same case id."""
    first: dict[str, Variant] = {}
    for variant in variants:
        cid = case_id(name, variant.values)
        if cid in first:
            earlier = first[cid]
            key = next(
                k for (k, _), i, j in zip(variant.values, earlier.indexes, variant.indexes)
                if i != j
            )
            raise ProblemError(
                Problem(("matrix", key),
                        f"two matrix points give the same case id '{cid}': "
                        f"{earlier.matrix_values} and {variant.matrix_values}; "
                        "make the values distinct")
            )
        first[cid] = variant
