"""The recording workflow of ``dcp-harness golden record DIR``: keep a sweep's trusted values as
golden files.

For every case of the sweep folder whose plan has a ``golden`` pair, the golden arm's records are
written (atomically) to ``<golden dir>/<case id>/golden_values_<key>.json`` (``harness.golden``):
the golden folder the plan resolved when the sweep ran (the case file's ``compare.golden.dir``,
absolute), or ``into`` (``DIR/<case id>/...``, e.g. to copy them back from another machine). The
key is the platform (``platform``, else ``compare.golden.platform``, else the platform the arm ran
on: ``cpu``, ``h200``, ...), prefixed with ``compare.golden.environment`` (``auto``: the records'
torch/CUDA versions) when set. The arm must have finished ok with every step on every rank it
records on; a case whose arm did not is ``not recorded`` (the other cases are still written). A
case whose arm this sweep skipped (not run here: a GPU case of a CPU sweep) is ``skipped``, not an
error. The sweep judged the golden values as they were when it ran (its copy,
``harness.golden.snapshot``): :func:`rerun_note` says what judges it again with the new ones.

``repeats`` N (Megatron-LM's ``compute_golden_statistics.py``): the arm runs N - 1 more times,
into ``<sweep>/golden-repeats/<case>/repeat<k>/<arm>`` (a later recording resumes them), and the
file keeps the per-step median with the spread and the bounds (``harness.golden.files``). It
refuses to write a file (naming the metric and why, ``harness.golden.bounds.refusals``) when the
repeats disagree by more than the golden check's own loss bounds, or when a step-time or memory
metric the verdict checks varies by more than ``max_cv``.

What runs an arm again, and the rule of when an arm's folder holds a complete run, come in as
:class:`ArmRuns` (the CLI passes the local launcher's ``launch.local.lanes.run_arm_into`` and
``launch.ranks.completion.arm_is_complete``), so this module imports no launcher and stands on
floor 6, above ``caseplan`` and ``compare``. What it does is said line by line through ``say``.
Pure Python: no torch.
"""

from __future__ import annotations

import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional, Protocol, Sequence

from harness.caseplan import CasePlan, PlannedArm, read_plan
from harness.compare import GoldenPairParams
from harness.errors import ConfigError
from harness.results import (CASE_FILE, ArmOutcome, RunEnvironment, read_arm_env, read_outcome,
                             read_steps, sweep_lock)
from harness.spec.names import GOLDEN

from .bounds import refusals
from .files import GoldenError, read_golden, same_kernels, write_golden
from .keys import VARIANT_SEP, golden_file, golden_key, resolve_environment, variant_name
from .metrics import MEMORY, METRICS, TIME, environment_of, platform_of
from .spread import MAX_CV

REPEATS_DIR = "golden-repeats"
CASE_HASH_FILE = "case.hash"  # the plan's case_hash the repeats ran
MAX_REPEATS = 20
# What ``golden record`` did with a case.
WRITTEN, NOT_RECORDED, SKIPPED, NO_GOLDEN = "written", "not recorded", "skipped", "no golden"

Say = Callable[[str], None]  # one line of what the recording does, as it does it


class ArmRunner(Protocol):
    """Runs one planned arm into ``arm_dir`` and says how it ended (never raises for a failing
    arm): ``launch.local.lanes.run_arm_into`` bound to a launcher."""

    def __call__(self, plan: CasePlan, arm: PlannedArm, arm_dir: Path,
                 case_json: Path) -> ArmOutcome: ...


class ArmComplete(Protocol):
    """Whether ``arm_dir`` holds a complete run of ``arm`` (its outcome ok, every step on every
    rank it records on): ``launch.ranks.completion.arm_is_complete``, the one rule."""

    def __call__(self, arm: PlannedArm, arm_dir: Path) -> bool: ...


@dataclass(frozen=True)
class ArmRuns:
    """How the recording reaches the arms: what runs one again, and when one is complete."""

    run: ArmRunner
    complete: ArmComplete


@dataclass(frozen=True)
class Recording:
    """What ``golden record`` is asked to do (its flags, checked by the CLI)."""

    platform: Optional[str] = None
    environment: Optional[str] = None
    into: Optional[Path] = None
    beside: bool = False
    repeats: int = 1
    max_cv: float = MAX_CV


@dataclass(frozen=True)
class CaseRecorded:
    """What the recording did with one case (``WRITTEN``, ``NOT_RECORDED``, ``SKIPPED``,
    ``NO_GOLDEN``) and the case file its plan came from."""

    case_id: str
    result: str
    source: str


def case_dirs(sweep: Path, cases: Optional[Sequence[str]] = None) -> list[Path]:
    """The case folders of ``sweep`` (those of ``cases`` only, when given); ConfigError for a
    case it does not hold, or a folder that holds none."""
    found = sorted(p.parent for p in sweep.glob(f"*/{CASE_FILE}"))
    if cases:
        unknown = sorted(set(cases) - {d.name for d in found})
        if unknown:
            raise ConfigError(f"{sweep} has no case(s) {', '.join(unknown)}")
        found = [d for d in found if d.name in cases]
    if not found:
        raise ConfigError(f"{sweep} holds no case folders (no */{CASE_FILE})")
    return found


def record_sweep(sweep: Path, folders: Sequence[Path], recording: Recording, runs: ArmRuns,
                 say: Say) -> tuple[CaseRecorded, ...]:
    """Record every case of ``folders`` (module doc), holding the sweep's lock."""
    with sweep_lock(sweep, busy="wait for the sweep to end before recording its golden values"):
        return tuple(record_case(case_dir, recording, runs, say) for case_dir in folders)


def rerun_note(sweep: Path, sources: Sequence[str]) -> str:
    """What to run so that ``sweep`` is judged with the golden values just written: it judged
    the copy taken when it ran."""
    files = [os.path.relpath(f) if Path(f).resolve().is_relative_to(Path.cwd()) else f
             for f in dict.fromkeys(sources)]
    return (f"the sweep {sweep} judged the copy taken when it ran; re-run `dcp-harness run "
            f"{shlex.join(files)} --out {shlex.quote(str(sweep))}` to judge with the new values")


def checked_metrics(params: GoldenPairParams, platform: str) -> set[str]:
    """The step-time and memory metrics the verdict checks on ``platform``."""
    out: set[str] = set()
    for m in METRICS:
        if m.kind == TIME and params.step_time is not None and (platform != "cpu"
                                                                or params.step_time.on_cpu):
            out.add(m.name)
        elif m.kind == MEMORY and params.memory is not None:
            out.add(m.name)
    return out


def run_repeats(plan: CasePlan, arm: PlannedArm, case_dir: Path, repeats: int, runs: ArmRuns,
                say: Say) -> tuple[list[Path], Optional[str]]:
    """The arm folders of repeats 2..N (run now through ``runs`` unless complete), or the reason
    one did not finish. Repeats of another definition of the case (their ``case.hash`` is not the
    plan's ``case_hash``) are removed and run again."""
    root = case_dir.parent / REPEATS_DIR / plan.case_id
    hash_file = root / CASE_HASH_FILE
    stored = hash_file.read_text().strip() if hash_file.is_file() else None
    if repeats > 1 and stored != plan.case_hash:
        if root.is_dir() and any(root.glob("repeat*")):
            was = f"case hash {stored[:12]}" if stored else "no case hash stored"
            say(f"      {plan.case_id}: the repeats in {root} ran another definition of the case "
                f"({was}, now {plan.case_hash[:12]}); running them again")
            shutil.rmtree(root)
        root.mkdir(parents=True, exist_ok=True)
        hash_file.write_text(plan.case_hash + "\n")
    folders = []
    for k in range(2, repeats + 1):
        arm_dir = root / f"repeat{k}" / arm.name
        folders.append(arm_dir)
        if runs.complete(arm, arm_dir):
            say(f"      {plan.case_id}: repeat {k}/{repeats} of arm '{arm.name}' already complete "
                f"({arm_dir})")
            continue
        say(f"      {plan.case_id}: repeat {k}/{repeats} of arm '{arm.name}' -> {arm_dir}")
        outcome = runs.run(plan, arm, arm_dir, case_dir / CASE_FILE)
        if not outcome.ok or not runs.complete(arm, arm_dir):
            return folders, (f"repeat {k} of arm '{arm.name}' {outcome.describe()} "
                             f"(log: {arm_dir / 'log.txt'})")
    return folders, None


def record_case(case_dir: Path, recording: Recording, runs: ArmRuns, say: Say) -> CaseRecorded:
    """Record one case (module doc); what it did, said as it goes."""
    plan = read_plan(case_dir)

    def done(result: str) -> CaseRecorded:
        return CaseRecorded(plan.case_id, result, plan.source)

    pair = next((p for p in plan.pairs if p.contract == GOLDEN), None)
    if pair is None:
        say(f"skip  {plan.case_id}: declares no compare.golden")
        return done(NO_GOLDEN)
    if pair.skipped is not None:  # e.g. emulated ranks: their losses are not the model's
        say(f"skip  {plan.title}: its golden pair is not judged here ({pair.skipped})")
        return done(NO_GOLDEN)
    params: GoldenPairParams = pair.params
    arm = plan.arm(pair.arms[0])
    arm_dir = case_dir / arm.name
    outcome = read_outcome(arm_dir)
    if outcome is not None and outcome.status == "skipped":  # e.g. a GPU case of a CPU sweep
        say(f"skip  {plan.case_id}: arm '{arm.name}' did not run in this sweep "
            f"({outcome.detail}); record it from a sweep where it ran")
        return done(SKIPPED)
    if not runs.complete(arm, arm_dir):
        say(f"ERROR {plan.case_id}: arm '{arm.name}' did not finish ok with all "
            f"{plan.steps} steps on every rank ({arm_dir}); not recorded")
        return done(NOT_RECORDED)
    folder = recording.into if recording.into is not None else Path(params.golden_dir)
    if recording.into is None and not folder.parent.is_dir():
        say(f"ERROR {plan.case_id}: the golden folder {folder} (where the case file's "
            "compare.golden.dir pointed when the sweep ran) is not on this machine; pass "
            "--into DIR and copy the file there")
        return done(NOT_RECORDED)
    first = read_steps(arm_dir)
    platform = recording.platform or params.platform or platform_of(first)
    try:  # needs only the sweep's run: checked before any repeat runs
        environment = resolve_environment(recording.environment or params.environment, first)
    except ValueError as exc:
        say(f"ERROR {plan.case_id}: {exc}; not recorded")
        return done(NOT_RECORDED)
    repeat_dirs, failed = run_repeats(plan, arm, case_dir, recording.repeats, runs, say)
    if failed is not None:
        say(f"ERROR {plan.case_id}: {failed}; not recorded")
        return done(NOT_RECORDED)
    all_runs = [first] + [read_steps(d) for d in repeat_dirs]
    window = params.step_time.window if params.step_time is not None else None
    why = refusals(all_runs, loss_bounds={"lm loss": params.loss, "aux loss": params.aux_loss,
                                          "grad norm": params.grad_norm},
                   checked=checked_metrics(params, platform_of(all_runs[0])), window=window,
                   max_cv=recording.max_cv)
    if why:
        for line in why:
            say(f"REFUSED {plan.case_id}: {line}")
        say(f"ERROR {plan.case_id}: the {len(all_runs)} repeats are too unsteady to keep as "
            "golden values; not recorded")
        return done(NOT_RECORDED)
    try:
        path = write_golden(target_file(folder, plan.case_id, golden_key(platform, environment),
                                        environment_of(first), recording.beside), all_runs,
                            window=window, arm=arm.name, inherited_env=read_arm_env(arm_dir))
    except (GoldenError, OSError) as exc:
        say(f"ERROR {plan.case_id}: {exc}; not recorded")
        return done(NOT_RECORDED)
    bounds = _bounds_line(path) if len(all_runs) > 1 else ""
    say(f"wrote {path} (arm {arm.name}, platform {platform}"
        f"{f', environment {environment}' if environment else ''}, {plan.steps} steps, "
        f"{len(all_runs)} run(s){bounds})")
    return done(WRITTEN)


def target_file(folder: Path, case_id: str, key: str, env: Optional[RunEnvironment],
                beside: bool) -> Path:
    """Where ``golden record`` writes a run of kernels ``env``: the file of ``key`` (its own or
    one beside it, ``harness.golden.keys_of``) recorded with the same kernels; else, with
    ``beside``, ``golden_values_<key>.<variant>.json`` (``harness.golden.variant_name``); else
    the key's own file."""
    own = golden_file(folder, case_id, key)
    for path in [own] + sorted(own.parent.glob(f"golden_values_{key}{VARIANT_SEP}*.json")):
        if path.is_file():
            try:
                if same_kernels(read_golden(path), env):
                    return path
            except GoldenError:
                continue
    if beside:
        return own.with_name(f"golden_values_{key}{VARIANT_SEP}{variant_name(env)}.json")
    return own


def _bounds_line(path: Path) -> str:
    golden = read_golden(path)
    parts = [f"{m} rtol {golden.rtol(m):.3g}" for m in golden.metrics if golden.rtol(m) is not None]
    return ("; " + ", ".join(parts)) if parts else ""
