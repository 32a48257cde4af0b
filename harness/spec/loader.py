"""Case files -> validated :class:`Case` objects (safe YAML, matrix, presets, preflight).

Every problem becomes one :class:`~harness.errors.CaseError` rendered as
``FILE[:LINE]: case 'CASE': field 'a.b.c': message``; where the case has more problems, each
follows on its own line, ``  also field 'x.y' (line N): message``.
"""

from __future__ import annotations

import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence, Union

from pydantic import ValidationError

from harness.errors import CaseError, ConfigError
from harness.spec.expand import Variant, case_id, check_unique_ids, expand_matrix
from harness.spec.preflight import preflight
from harness.spec.presets import UnknownPresetError, resolve_model
from harness.spec.problems import Loc, Problem, ProblemError
from harness.spec.schema import NAME_PATTERN, Case, CaseFile
from harness.spec.validation import all_problems
from harness.spec.yamlfile import ParsedYaml, parse_case_yaml

CASE_SUFFIXES = (".yaml", ".yml")
_NAME_RE = re.compile(NAME_PATTERN)

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class LoadedCase:
    """A case and where its id was given (for duplicate-id messages)."""

    case: Case
    line: Optional[int]


def find_case_files(paths: Iterable[PathLike]) -> list[Path]:
    """The case files named by ``paths``: files as given, folders as every ``*.yaml``/``*.yml``
    below them (sorted; hidden files and folders skipped). Each file once, first mention wins."""
    found: list[Path] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            named = sorted(
                p for p in path.rglob("*")
                if p.suffix in CASE_SUFFIXES
                and not any(part.startswith(".") for part in p.relative_to(path).parts)
            )
            for p in named:
                if p.is_symlink() and not p.exists():  # a dangling or looping link: say so
                    raise ConfigError(f"{p}: {_why_unusable(p)}")
            below = [p for p in named if p.is_file()]
            if not below:
                raise ConfigError(f"{path}: folder holds no case files (*.yaml, *.yml)")
            candidates = below
        elif path.is_file():
            candidates = [path]
        else:
            raise ConfigError(f"{path}: {_why_unusable(path)}")
        for candidate in candidates:
            key = candidate.resolve()
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    return found


def _why_unusable(path: Path) -> str:
    """Why ``path`` is neither a file nor a folder one can read cases from."""
    try:
        os.stat(path)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return "symlink loop (following its links never reaches a file); fix or remove the link"
        if exc.errno == errno.ENOENT and path.is_symlink():
            return f"broken symlink (its target {os.readlink(path)} does not exist)"
        if exc.errno == errno.ENOENT:
            return "no such file or folder"
        return f"cannot be read: {exc.strerror or exc}"
    return "not a file or folder"


def load_cases(paths: Union[PathLike, Iterable[PathLike]]) -> list[Case]:
    """Every case in ``paths`` (files or folders), in file order then matrix order.

    Raises ConfigError for a missing path or an empty folder and CaseError for the first problem
    in a case file; case ids must be unique across the whole call.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    path_list = list(paths)
    if not path_list:
        raise ConfigError("no case files given")
    cases: list[Case] = []
    where: dict[str, str] = {}
    for file in find_case_files(path_list):
        for loaded in load_case_file(file):
            case = loaded.case
            if case.id in where:
                raise CaseError(
                    f"duplicate case id '{case.id}' (also defined in {where[case.id]}); "
                    "case ids must be unique across the files of one run",
                    file=case.source, case=case.id, field="name", line=loaded.line)
            where[case.id] = case.source if loaded.line is None else (
                f"{case.source}:{loaded.line}")
            cases.append(case)
    return cases


def load_case_file(path: PathLike) -> list[LoadedCase]:
    """The cases of one file (several when it has a ``matrix:``)."""
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise CaseError(f"not UTF-8 text ({exc.reason} at byte {exc.start})", file=file) from None
    except OSError as exc:
        raise ConfigError(f"{file}: cannot read: {exc.strerror or exc}") from None
    return cases_from_text(text, file)


def cases_from_text(text: str, file: str) -> list[LoadedCase]:
    """The cases of one case document given as text (``file`` names it in errors)."""
    parsed = parse_case_yaml(text, file)
    raw = parsed.data
    if not isinstance(raw, dict):
        raise CaseError(
            f"a case file holds one mapping (name:, train:, ...), not a {type(raw).__name__}",
            file=file, line=1)
    name = raw.get("name")
    label = name if isinstance(name, str) else None
    try:
        variants = expand_matrix(raw)
        if label is not None and _NAME_RE.match(label):
            check_unique_ids(label, variants)
    except ProblemError as exc:
        raise _located(exc.problem, parsed, file, label) from None
    return [_build(variant, parsed, file, label) for variant in variants]


def _build(variant: Variant, parsed: ParsedYaml, file: str, name: Optional[str]) -> LoadedCase:
    """Validate, resolve and preflight one matrix point.

    Errors in a field the matrix set are labelled with the variant's id, others with the name.
    """
    named = name is not None and _NAME_RE.match(name) is not None
    variant_id = case_id(name, variant.values) if named and name is not None else name

    def fail(problem: Problem, others: Sequence[Problem] = ()) -> CaseError:
        label = variant_id if variant.value_loc(problem.loc) is not None else name
        return _located(problem, parsed, file, label, others, variant)

    try:
        spec = CaseFile.model_validate(variant.data)
    except ValidationError as exc:
        first, *others = all_problems(exc)
        raise fail(first, others) from None
    try:
        model = resolve_model(spec.model)
    except UnknownPresetError as exc:
        raise fail(Problem(("model", "preset"), str(exc))) from None
    case = Case.of_file(spec, id=case_id(spec.name, variant.values), source=file, model=model,
                        matrix_values=variant.matrix_values)
    problems = preflight(case)
    if problems:
        raise _located(problems[0], parsed, file, case.id, problems[1:], variant)
    return LoadedCase(case=case, line=parsed.line_of(("name",)))


def _line(problem: Problem, parsed: ParsedYaml, variant: Optional[Variant]) -> Optional[int]:
    """The line of ``problem``'s field (or of the matrix value that set it)."""
    line_loc: Loc = problem.loc
    if variant is not None:
        line_loc = variant.value_loc(problem.loc) or problem.loc
    return parsed.line_of(line_loc)


def _also(problem: Problem, parsed: ParsedYaml, variant: Optional[Variant]) -> str:
    line = _line(problem, parsed, variant)
    where = f"field '{problem.field}'" if problem.field else "the case"
    return f"\n  also {where}{f' (line {line})' if line is not None else ''}: {problem.message}"


def _located(problem: Problem, parsed: ParsedYaml, file: str, case: Optional[str],
             others: Sequence[Problem] = (), variant: Optional[Variant] = None) -> CaseError:
    """A CaseError at the line of ``problem``'s field, listing every other problem after it."""
    message = problem.message + "".join(_also(p, parsed, variant) for p in others)
    return CaseError(message, file=file, case=case, field=problem.field or None,
                     line=_line(problem, parsed, variant))

