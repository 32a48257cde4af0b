"""A command case (``command:``, ``harness.spec.schema.CommandSpec``): the arguments of each arm
and the preflight rules of such a case (pure; the launcher runs it: ``harness.launch.ranks.command``).

An arm runs ``command.argv`` plus the arguments ``command.arms`` gives its role (the arm's kind:
``eager`` / ``dcp``, ``graph``, ``graph-separate-pools``, ``fixed-cp``, ``graph-fixed-cp``,
``reference``), plus ``command.arms.repeat`` for the second run of a repeat pair. Placeholders
(:data:`PLACEHOLDERS`, ``{name}``; ``{{`` is a brace) are filled per arm in the arguments, the
``env`` values and ``metrics.path``.

Preflight rules of a command case (:func:`check_command`, in place of the built-in workload's
model, microbatch, shape and graph rules; the layout, compare and golden-window rules stand, and
each comparison says which arm roles it needs and whether a command case may have it:
``harness.spec.comparisons.command_problems``):

* ``graphs:``, ``shapes:`` and ``emulate:`` are the built-in workload's (the graph arm of a
  command case is ``command.arms.graph``; :func:`built_in_only`);
* every placeholder is known (``{fixed_cp}`` only in the fixed-CP roles, ``{master_addr}``,
  ``{master_port}``, ``{node_rank}`` only with ``ranks: launcher``); a ``secret_env`` name is
  not also an ``env`` key.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Iterable, Mapping, Optional

from harness.spec.names import FIXED_CP_KINDS, REPEAT_ROLE
from harness.spec.problems import Loc, Problem
from harness.spec.schema import BaseCase, CommandSpec, RankStart

PLACEHOLDERS = ("arm_dir", "steps", "world_size", "seed", "case_dir", "nnodes", "nproc_per_node",
                "fixed_cp", "master_addr", "master_port", "node_rank", "stop")
FIXED_CP_ROLES = FIXED_CP_KINDS
# A launcher's rendezvous (ranks: launcher); a rank started by the harness has it in its environment.
LAUNCHER_PLACEHOLDERS = ("master_addr", "master_port", "node_rank")
# The two runs of a ``-resumed`` arm: the arguments command.resume adds to each.
RESUME_LEGS = ("save", "load")
RESUME_ROLE = "resume"  # the role of command.resume's texts (where {stop} may be)


def _at(field: str) -> Loc:
    """The location of a dotted field path, list indices as ints (for the error's line)."""
    return tuple(int(p) if p.isdigit() else p for p in field.split("."))


def placeholders_in(text: str) -> list[str]:
    """The ``{name}`` placeholders of ``text``; a ValueError for a malformed one."""
    return [name for _, name, _, _ in string.Formatter().parse(text) if name is not None]


def fill(text: str, values: Mapping[str, object]) -> str:
    """``text`` with its placeholders replaced by ``values``."""
    return text.format_map({k: str(v) for k, v in values.items()})


def command_dir(source: str, command: CommandSpec) -> Path:
    """Where a command case's command starts: ``command.cwd`` relative to the folder of the case
    file ``source`` (default: that folder)."""
    base = Path(source).parent
    return (base / command.cwd).resolve() if command.cwd else base


def role_args(command: CommandSpec, kind: str, repeat: bool) -> list[str]:
    """The arguments an arm of ``kind`` adds to ``command.argv`` (and ``repeat``'s)."""
    return list(command.arms.get(kind, [])) + (list(command.arms.get(REPEAT_ROLE, [])) if repeat
                                                 else [])


def leg_args(command: CommandSpec, leg: Optional[str]) -> list[str]:
    """The arguments one run of a ``-resumed`` arm adds: ``command.resume.save`` for its first
    run (``leg="save"``), ``load`` for its second; none for an arm run once (``leg=None``)."""
    if leg is None:
        return []
    assert command.resume is not None and leg in RESUME_LEGS
    return list(getattr(command.resume, leg))


def arm_argv(command: CommandSpec, kind: str, repeat: bool, values: Mapping[str, object],
             leg: Optional[str] = None) -> list[str]:
    """The full argument vector of one arm (of one run of a ``-resumed`` arm: ``leg``), its
    placeholders filled."""
    return [fill(a, values) for a in list(command.argv) + role_args(command, kind, repeat)
            + leg_args(command, leg)]


def built_in_only(field: str, why: str) -> Problem:
    """``field`` set in a command case, though only the built-in workload has it (``why``)."""
    return Problem(_at(field), f"is the built-in workload's, not a command case's ({why}): drop it")


def _texts(cmd: CommandSpec) -> Iterable[tuple[str, Optional[str], str]]:
    """(field, role or None, text) of every text placeholders are filled in."""
    for i, a in enumerate(cmd.argv):
        yield f"command.argv.{i}", None, a
    for k, v in cmd.env.items():
        yield f"command.env.{k}", None, v
    for role, args in cmd.arms.items():
        for i, a in enumerate(args):
            yield f"command.arms.{role}.{i}", role, a
    if cmd.metrics.path is not None:
        yield "command.metrics.path", None, cmd.metrics.path
    if cmd.resume is not None:
        for leg in RESUME_LEGS:
            for i, a in enumerate(getattr(cmd.resume, leg)):
                yield f"command.resume.{leg}.{i}", RESUME_ROLE, a
        if cmd.resume.iteration_file is not None:
            yield "command.resume.iteration_file", RESUME_ROLE, cmd.resume.iteration_file


def _placeholder_problems(cmd: CommandSpec) -> list[Problem]:
    problems = []
    for field, role, text in _texts(cmd):
        try:
            names = placeholders_in(text)
        except ValueError as exc:
            problems.append(Problem(_at(field), f"{text!r}: {exc} (write {{{{ for a brace)"))
            continue
        for name in names:
            if name not in PLACEHOLDERS:
                problems.append(Problem(_at(field), f"unknown placeholder {{{name}}}; known: "
                                        + ", ".join(f"{{{p}}}" for p in PLACEHOLDERS)))
            elif name == "fixed_cp" and role not in FIXED_CP_ROLES:
                problems.append(Problem(_at(field), "{fixed_cp} is the CP size of a fixed-CP "
                                        "arm: use it in command.arms.fixed-cp (or graph-fixed-cp)"))
            elif name == "stop" and role != RESUME_ROLE:
                problems.append(Problem(_at(field), "{stop} is the step a -resumed arm stops "
                                        "after (compare.resume.at_step): use it in "
                                        "command.resume.save or load"))
            elif name in LAUNCHER_PLACEHOLDERS and cmd.ranks is not RankStart.LAUNCHER:
                problems.append(Problem(_at(field), f"{{{name}}} is a launcher's rendezvous "
                                        "(command.ranks: launcher); with per_rank each rank has "
                                        "MASTER_ADDR, MASTER_PORT and RANK in its environment"))
    return problems


def _resume_problems(case: BaseCase) -> list[Problem]:
    """``compare.resume`` and ``command.resume`` go together: one says which arms are stopped
    and resumed, the other how the command saves and loads."""
    cmd = case.command
    assert cmd is not None
    compare = getattr(case, "compare", None)
    if compare is None:  # an arm's case: the pairs are its user case's
        return []
    wants = getattr(compare, "resume", None) is not None
    if wants and cmd.resume is None:
        return [Problem(_at("command.resume"), "compare.resume stops an arm and resumes it: say "
                        "how the command saves and loads, e.g. resume: {save: [--save, "
                        "'{arm_dir}/ckpt', --save-interval, '{stop}', --exit-interval, '{stop}'], "
                        "load: [--load, '{arm_dir}/ckpt']}")]
    if cmd.resume is not None and not wants:
        return [Problem(_at("command.resume"), "no arm is resumed without compare.resume: add "
                        "compare.resume: {} (or drop command.resume)")]
    return []


def check_command(case: BaseCase) -> list[Problem]:
    """The rules of the module doc (nothing for a built-in case)."""
    cmd = case.command
    if cmd is None:
        return []
    problems = [built_in_only(section, why) for section, why in (
        ("graphs", "the graph arm of a command case is command.arms.graph"),
        ("shapes", "the command decides its own shapes"),
        ("emulate", "a command's ranks cannot be emulated")) if getattr(case, section) is not None]
    problems += _placeholder_problems(cmd)
    problems += _resume_problems(case)
    clash = sorted(set(cmd.secret_env) & set(cmd.env))
    if clash:
        problems.append(Problem(_at("command.secret_env"), f"{', '.join(clash)} also in "
                                "command.env: a secret's value comes from the harness's own "
                                "environment, never from the case file"))
    return problems
