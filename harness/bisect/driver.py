"""The bisect: check the request, verify both ends, search, and keep the state after each step.

Every refusal comes before anything runs and writes nothing: unknown revisions, the good commit
not an ancestor of the bad one, an empty range, local changes that matter
(:func:`check_local_changes`), another bisect's folder. The ends are judged first; a good end that
does not pass (or a bad end that does not fail) stops the bisect with that step's verdict and
failing checks, its sweep kept. Each step runs in a worktree of its own under the bisect's folder
(``worktrees/<sha>``, removed after the step unless kept; the user's checkout is never touched),
and its sweep, log and case copies stay in ``steps/<n>-<sha>/``.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence, Union

from harness.bisect.git import (add_worktree, changed_files, first_parent_path, head, is_ancestor,
                                remove_worktree, resolve, subjects)
from harness.bisect.search import Found, Probe, Verdict, next_step
from harness.bisect.state import (BisectKey, BisectState, Role, Step, check_folder, now,
                                  write_state)
from harness.bisect.step import LOG_FILE, FailedCheck, failing_checks, judge, run_command
from harness.bisect.target import (Target, find_target, profile_argument, step_command,
                                   step_environment, step_paths)
from harness.errors import ConfigError
from harness.history import ENV_VAR as HISTORY_ENV
from harness.results import MANIFEST_FILE

DEFAULT_ROOT = Path("results")
SLURM_JOBS = Path("slurm") / "jobs.json"  # a submitted Slurm sweep (collect it, never resubmit)

Log = Callable[[str], None]
OnSweep = Callable[[Path], None]


@dataclass(frozen=True)
class Request:
    good: str
    bad: str
    paths: tuple[str, ...]
    k: Optional[str] = None
    repo: Optional[Path] = None
    profile: Optional[str] = None
    out: Optional[Path] = None
    keep_worktrees: bool = False
    allow_dirty: bool = False
    history: Optional[str] = None  # the history database's URL, handed to every step's harness


@dataclass(frozen=True)
class Outcome:
    """Where a bisect ended: ``found`` (None when an end was refused: ``refused`` says why) and
    the failing checks of the first bad commit's sweep (or of the end that was refused)."""

    out: Path
    state: BisectState
    found: Optional[Found] = None
    refused: Optional[str] = None
    failing: tuple[FailedCheck, ...] = ()
    warnings: tuple[str, ...] = field(default=())


def default_out(key: BisectKey, root: Path = DEFAULT_ROOT) -> Path:
    """``results/bisect-<good>-<bad>-<hash of the key>``: the same command finds its own folder
    again (and resumes); another command gets another folder."""
    digest = hashlib.sha256(json.dumps(key.model_dump(mode="json"), sort_keys=True).encode())
    return root / f"bisect-{key.good[:8]}-{key.bad[:8]}-{digest.hexdigest()[:8]}"


def check_local_changes(target: Target, ends: Sequence[str], allow_dirty: bool) -> None:
    """Local changes matter when an end is the checkout's HEAD: what failed here is then not
    that commit. Refused unless ``allow_dirty`` (nothing is touched either way)."""
    changed = changed_files(target.repo)
    if not changed or allow_dirty or head(target.repo) not in ends:
        return
    shown = ", ".join(changed[:5]) + (f" and {len(changed) - 5} more" if len(changed) > 5 else "")
    raise ConfigError(f"{target.repo} has local changes ({shown}) and an end of the range is its "
                      "HEAD: the steps run commits, not your working tree, so that end would not "
                      "be the code you ran; commit or stash them (bisect never touches your "
                      "checkout), or pass --allow-dirty to bisect the commits as they are")


def plan(request: Request) -> tuple[Target, BisectKey, list[str]]:
    """The target, the bisect's key and the commit line; ConfigError before anything is written."""
    target = find_target(request.paths, request.k, request.repo)
    good = resolve(target.repo, request.good, "--good")
    bad = resolve(target.repo, request.bad, "--bad")
    if good == bad:
        raise ConfigError(f"--good {request.good} and --bad {request.bad} are the same commit "
                          f"({good[:12]}); give a good commit before the bad one")
    if not is_ancestor(target.repo, good, bad):
        raise ConfigError(f"--good {request.good} ({good[:12]}) is not an ancestor of --bad "
                          f"{request.bad} ({bad[:12]}) in {target.repo}: the good commit must come "
                          "before the bad one in its history (swapped? `git log --graph` shows "
                          "how they relate)")
    commits = first_parent_path(target.repo, good, bad)
    if not commits or commits[-1] != bad:
        raise ConfigError(f"no commits between --good {good[:12]} and --bad {bad[:12]} on the "
                          "bad commit's first-parent line")
    check_local_changes(target, (good, bad), request.allow_dirty)
    key = BisectKey(repo=str(target.repo), mode=target.mode, good=good, bad=bad,
                    paths=tuple(str(p) for p in target.paths), k=request.k,
                    profile=profile_argument(request.profile))
    return target, key, commits


def bisect(request: Request, *, on_sweep: Optional[OnSweep] = None,
           log: Log = print) -> Outcome:
    """Run (or resume) the bisect of ``request``; ``on_sweep(sweep_dir)`` is called for each
    step's sweep once it is judged (the history). KeyboardInterrupt leaves the state resumable."""
    target, key, commits = plan(request)
    out = (request.out if request.out is not None else default_out(key)).resolve()
    state = check_folder(out, key)
    if state is None:
        state = BisectState(key=key, commits=tuple(commits))
        write_state(out, state)
        log(f"bisect: {len(commits)} commit(s) after the good end on the first-parent line of "
            f"{target.repo}; state in {out}")
    else:
        log(f"bisect: resuming {out} ({len(state.judged())} step(s) judged)")
    runner = _Runner(target, out, state, key.profile, request.keep_worktrees, on_sweep, log,
                     request.history)
    for role, sha in ((Role.GOOD_END, key.good), (Role.BAD_END, key.bad)):
        step = runner.judged(sha, role, retry_skip=True)
        wanted = Verdict.GOOD if role is Role.GOOD_END else Verdict.BAD
        if step.verdict is not wanted:
            return runner.refused(step, wanted)
    while True:
        decision: Union[Probe, Found] = next_step(runner.state.commits, runner.state.judged())
        if isinstance(decision, Found):
            break
        runner.judged(decision.sha, Role.SEARCH)
    first = runner.state.step_of(decision.first_bad)
    failing = tuple(failing_checks(out / first.sweep)) if first is not None else ()
    return Outcome(out, runner.state, found=decision, failing=failing,
                   warnings=tuple(runner.warnings))


class _Runner:
    """Runs steps and keeps the state file current."""

    def __init__(self, target: Target, out: Path, state: BisectState, profile: Optional[str],
                 keep: bool, on_sweep: Optional[OnSweep], log: Log,
                 history: Optional[str] = None) -> None:
        self.target, self.out, self.state, self.profile = target, out, state, profile
        self.keep, self.on_sweep, self.log, self.history = keep, on_sweep, log, history
        self.warnings: list[str] = []
        self._subjects = subjects(target.repo, [*state.commits, state.key.good])

    def _save(self, step: Step) -> Step:
        self.state = self.state.with_step(step)
        write_state(self.out, self.state)
        return step

    def judged(self, sha: str, role: Role, retry_skip: bool = False) -> Step:
        """The judged step of ``sha``: the one on record, else a new run (or the re-run of one
        that was interrupted, into its own sweep folder). ``retry_skip``: a step on record that
        was skipped runs again, as a new step (an end must be judged; its cause may be fixed)."""
        known = self.state.step_of(sha)
        if known is not None and known.verdict is not None:
            if not (retry_skip and known.verdict is Verdict.SKIP):
                return known
            known = None
        n = known.n if known is not None else len(self.state.steps) + 1
        folder = Path("steps") / f"{n:02d}-{sha[:12]}"
        step = self._save(Step(n=n, sha=sha, subject=self._subjects.get(sha, ""), role=role,
                               sweep=str(folder / "sweep"), started=now()))
        self.log(f"step {n} ({role.value}): {sha[:12]} {step.subject}")
        judged = self._run(step, self.out / folder)
        step = self._save(step.model_copy(update={"verdict": judged.verdict, "ended": now(),
                                                  "exit_code": judged.exit_code,
                                                  "detail": judged.detail}))
        said = "skipped" if judged.verdict is Verdict.SKIP else f"is {judged.verdict.value}"
        self.log(f"step {n}: {sha[:12]} {said} ({judged.detail})")
        self._record(self.out / step.sweep)
        return step

    def _run(self, step: Step, step_dir: Path):
        worktree = self.out / "worktrees" / step.sha[:12]
        sweep = self.out / step.sweep
        log_file = step_dir / LOG_FILE
        collect = (sweep / SLURM_JOBS).is_file()  # submitted before an interruption
        add_worktree(self.target.repo, worktree, step.sha)
        leave = self.keep
        try:
            paths = step_paths(self.target, worktree, step_dir)
            env, cwd = step_environment(self.target, worktree)
            if self.history is not None:  # a step whose own `run` records its sweep: the same db
                env[HISTORY_ENV] = self.history
            argv = step_command(self.target, paths, sweep, self.profile, collect)
            code = run_command(argv, cwd, env, log_file)
        except KeyboardInterrupt:
            # a Slurm step's jobs go on running from the worktree: keep it for the resume
            leave = leave or (sweep / SLURM_JOBS).is_file()
            self.log(f"interrupted in step {step.n} ({step.sha[:12]}); run the same command "
                     f"again to resume (state: {self.out})")
            raise
        finally:
            if not leave:
                remove_worktree(self.target.repo, worktree)
        return judge(code, sweep, log_file)

    def _record(self, sweep: Path) -> None:
        """Hand a step's sweep to the history; a failure is a warning (the verdict stands)."""
        if self.on_sweep is None or not (sweep / MANIFEST_FILE).is_file():
            return
        try:
            self.on_sweep(sweep)
        except Exception as exc:  # a history problem must not lose the bisect's own result
            message = f"warning: {sweep} was not added to the history: {exc}"
            self.warnings.append(message)
            self.log(message)

    def refused(self, step: Step, wanted: Verdict) -> Outcome:
        """The outcome of an end whose verdict is not ``wanted`` (nothing after it runs)."""
        which = "good" if wanted is Verdict.GOOD else "bad"
        got = {Verdict.GOOD: "passes", Verdict.BAD: "fails",
               Verdict.SKIP: "could not be judged"}[step.verdict]
        fix = (f"pick an older --good that passes" if wanted is Verdict.GOOD and step.verdict
               is Verdict.BAD else f"pick a --bad whose sweep fails" if wanted is Verdict.BAD
               and step.verdict is Verdict.GOOD else "fix what stopped the sweep, then run the "
               "same command again (the other steps are kept)")
        why = ("the range does not bracket a regression" if step.verdict is not Verdict.SKIP
               else "an end must be judged before the search")
        reason = (f"the {which} end {step.sha[:12]} ({step.subject}) {got}: {step.detail}; "
                  f"{why}; {fix} (sweep: {self.out / step.sweep})")
        failing = tuple(failing_checks(self.out / step.sweep))
        return Outcome(self.out, self.state, refused=reason, failing=failing,
                       warnings=tuple(self.warnings))
