"""What a bisect checks out and what each step runs: the code under test and its repository.

* **Built-in cases** (no ``command:``): the code under test is the harness itself, its
  repository the git clone the running harness was imported from (or ``--repo DIR``, another
  clone of dcp-harness). Each step runs *that commit's* harness (``python -m harness`` with
  ``PYTHONPATH`` and the working directory at the step's worktree), on that commit's case files:
  a case path inside the repository is taken from the step's worktree at the same relative path
  (so it must be committed as it is, no local changes); a path outside is used as it is.
* **Command cases**: the code under test is the command's repository, found from the case: the
  git repository its ``command.cwd`` lies in (``--repo DIR`` must agree). The installed harness
  (the one running ``bisect``) runs every step, on the case files as they are now (the test is
  fixed, the code moves): each file is copied into the step's folder with ``command.cwd``
  replaced by the same folder inside the step's worktree, and the golden folders of its cases
  copied beside it. ``{case_dir}`` is then that copy's folder.
"""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence

import yaml

import harness
from harness.arms import plan_case
from harness.bisect.git import is_tracked_unchanged, repository_root, toplevel
from harness.bisect.state import Mode
from harness.history.labels import BISECT_LABEL, LABEL_ENV
from harness.compare.contracts.golden import golden_dir
from harness.errors import ConfigError
from harness.launch.ranks.command import command_cwd
from harness.spec import Case, load_cases, select_cases
from harness.spec.loader import find_case_files, load_case_file
from harness.spec.yamlfile import parse_case_yaml

CASES_DIR = "cases"  # a command step's copies of the case files, in its step folder


@dataclass(frozen=True)
class Target:
    mode: Mode
    repo: Path  # the repository root
    paths: tuple[Path, ...]  # the case paths as given, absolute
    k: Optional[str]

    def inside(self, path: Path) -> Optional[Path]:
        """``path`` relative to the repository root, None when it lies outside."""
        return path.relative_to(self.repo) if path.is_relative_to(self.repo) else None


def _selected(paths: Sequence[Path], k: Optional[str]) -> list[Case]:
    cases = select_cases(load_cases(list(paths)), k=k)
    if not cases:
        raise ConfigError(f"no case selected: none of the cases in {' '.join(map(str, paths))} "
                          f"matches -k {k!r}; `dcp-harness validate` lists them")
    return cases


def find_target(paths: Sequence[str], k: Optional[str], repo: Optional[Path]) -> Target:
    """The target of a bisect of ``paths`` (module doc); ConfigError for cases of both kinds,
    a repository that cannot be found, or a built-in case path with local changes."""
    given = tuple(Path(p).resolve() for p in paths)
    cases = _selected(given, k)
    commands = [c for c in cases if c.command is not None]
    if commands and len(commands) != len(cases):
        builtin = [c.id for c in cases if c.command is None]
        raise ConfigError(f"bisect one kind of case at a time: {', '.join(c.id for c in commands)} "
                          f"run a command and {', '.join(builtin)} the built-in workload, whose "
                          "code lives in different repositories; narrow the selection with -k")
    if commands:
        target = Target(Mode.COMMAND, _command_repo(commands, repo), given, k)
    else:
        target = Target(Mode.BUILTIN, _harness_repo(repo), given, k)
        _check_committed(target)
    return target


def _harness_repo(repo: Optional[Path]) -> Path:
    if repo is not None:
        return repository_root(repo.resolve(), "--repo")
    package = Path(harness.__file__).resolve().parent
    root = toplevel(package)
    if root is None:
        raise ConfigError(f"the running harness ({package}) is not in a git clone, so there is no "
                          "history of it to bisect; give --repo DIR (a clone of dcp-harness)")
    return root


def _command_repo(cases: Sequence[Case], repo: Optional[Path]) -> Path:
    """The one repository every case's ``command.cwd`` lies in (``--repo`` when given)."""
    given = repository_root(repo.resolve(), "--repo") if repo is not None else None
    roots: dict[Path, list[str]] = {}
    for case in cases:
        assert case.command is not None
        cwd = command_cwd(plan_case(case), case.command)
        root = toplevel(cwd)
        if given is not None and not cwd.is_relative_to(given):
            raise ConfigError(f"{case.source}: case '{case.id}': field 'command.cwd': the command "
                              f"runs in {cwd}, outside --repo {given}; each step runs it from the "
                              "step's checkout of that repository, so it must lie inside it")
        if root is None:
            raise ConfigError(f"{case.source}: case '{case.id}': field 'command.cwd': {cwd} is not "
                              "in a git repository, so there are no commits of the command to "
                              "bisect; point command.cwd into a git clone of your training code")
        roots.setdefault(given or root, []).append(case.id)
    if len(roots) > 1:
        where = "; ".join(f"{', '.join(ids)} in {root}" for root, ids in roots.items())
        raise ConfigError(f"the selected cases run commands of different repositories ({where}); "
                          "bisect one repository at a time: narrow the selection with -k")
    return next(iter(roots))


def _check_committed(target: Target) -> None:
    """A built-in case path inside the repository is read from each step's commit, so local
    changes to it would never run: refuse them."""
    for path in target.paths:
        rel = target.inside(path)
        if rel is not None and not is_tracked_unchanged(target.repo, str(rel) or "."):
            raise ConfigError(f"{path} has local changes or is not committed: each step reads the "
                              f"case files inside {target.repo} from its own commit, so these "
                              "changes would never run; commit them, or copy the case file outside "
                              "the repository and give that path (nothing was touched)")


def step_paths(target: Target, worktree: Path, step_dir: Path) -> list[str]:
    """The case paths a step runs (built-in: inside the worktree; command: the copies)."""
    if target.mode is Mode.BUILTIN:
        return [str(worktree / rel) if (rel := target.inside(p)) is not None else str(p)
                for p in target.paths]
    return [str(p) for p in copy_command_cases(target, worktree, step_dir / CASES_DIR)]


def copy_command_cases(target: Target, worktree: Path, into: Path) -> list[Path]:
    """Each case file of the target's paths copied into ``into/<i>/`` with ``command.cwd`` moved
    into ``worktree`` and its cases' golden folders beside it (module doc); the copies' paths."""
    if into.exists():
        shutil.rmtree(into)
    copies = []
    for i, file in enumerate(find_case_files(target.paths)):
        folder = into / str(i)
        data = parse_case_yaml(file.read_text(encoding="utf-8"), str(file)).data
        command = data.get("command") if isinstance(data, dict) else None
        if isinstance(command, dict):
            cwd = (file.parent / str(command.get("cwd") or ".")).resolve()
            rel = target.inside(cwd)
            command["cwd"] = str(worktree / rel) if rel is not None else str(cwd)
        for loaded in load_case_file(file):
            _copy_golden(loaded.case, file, folder)
        copy = folder / file.name
        copy.parent.mkdir(parents=True, exist_ok=True)
        copy.write_text(f"# {file} as bisect runs it: command.cwd in the step's checkout\n"
                        + yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        copies.append(copy)
    return copies


def _copy_golden(case: Case, file: Path, folder: Path) -> None:
    if case.compare.golden is None:
        return
    source = golden_dir(case) / case.id
    rel = Path(os.path.relpath(source, file.parent.resolve()))
    if ".." in rel.parts:
        raise ConfigError(f"{file}: case '{case.id}': field 'compare.golden.dir': {source} lies "
                          "outside the case file's folder, so bisect cannot copy it beside the "
                          "case; keep golden folders below the case file's folder")
    if source.is_dir():
        shutil.copytree(source, folder / rel, dirs_exist_ok=True)


def step_command(target: Target, paths: Sequence[str], sweep: Path, profile: Optional[str],
                 collect: bool) -> list[str]:
    """The ``dcp-harness`` command line of a step: ``run`` locally, ``submit --wait`` on Slurm,
    ``collect --wait`` for a Slurm step whose jobs were submitted before an interruption."""
    cli = [sys.executable, "-m", "harness"]
    if collect:
        return [*cli, "collect", str(sweep), "--wait"]
    select = ["-k", target.k] if target.k is not None else []
    if profile is None:
        # Its sweep is a bisect step's, not the user's newest: `results/latest` stays. (Only
        # this harness knows --no-latest; a built-in step runs its commit's own, in its worktree.)
        keep = ["--no-latest"] if target.mode is Mode.COMMAND else []
        return [*cli, "run", *paths, "--out", str(sweep), *keep, *select]
    return [*cli, "submit", *paths, "--profile", profile, "--out", str(sweep), "--wait", *select]


def step_environment(target: Target, worktree: Path) -> tuple[dict[str, str], Path]:
    """The environment and working directory of a step's ``dcp-harness``: built-in, the step's
    harness alone on ``PYTHONPATH`` and its worktree as the working directory (``python -m``
    puts the working directory first on the import path: another checkout of the harness there
    would be imported instead); command, bisect's own (what ``run`` finds relative to the
    working directory is what the user's own ``run`` would find). A step's sweep is labelled
    ``bisect`` (``$DCP_HARNESS_LABEL``: a harness that predates labels ignores it)."""
    env = {**os.environ, LABEL_ENV: BISECT_LABEL}
    if target.mode is Mode.BUILTIN:
        env["PYTHONPATH"] = str(worktree)
        return env, worktree
    return env, Path.cwd()


def profile_argument(profile: Optional[str]) -> Optional[str]:
    """``--profile`` as a step passes it on: a path made absolute (steps run elsewhere)."""
    if profile is None:
        return None
    path = Path(profile)
    if path.suffix in (".yaml", ".yml") or os.sep in profile:
        return str(path.resolve())
    return profile
