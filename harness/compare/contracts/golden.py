"""``golden``: one arm against its committed golden values (``compare.golden``;
``harness.golden`` keeps the files, Megatron-LM's layout).

LM loss, aux loss and grad norm of the lowest rank per step under the case's bounds (left out:
bitwise for a deterministic fp32 arm on CPU in the environment the file was recorded in,
``harness.golden.loss_bound``); step time
(the median over a steady window, :mod:`.golden_perf`) and memory (allocated, max allocated,
reserved per step, graph pool, device used after ``empty_cache``; largest over ranks; not
applicable without CUDA figures) two-sided, against the sweep plan's copy of the golden file of
the arm's platform (and environment, ``compare.golden.environment``). No file for that key:
:class:`GoldenMissing` (skipped with the command that records one, or an error with
``compare.golden.required``); a missing metric or step, or an unreadable file, raises
GoldenError: an error, never a pass."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping, Optional, Sequence

from pydantic import Field, field_validator

from harness import kernels as kern
from harness.environment import differences as env_differences
from harness.golden import (
    Golden,
    GoldenCopy,
    GoldenError,
    covered,
    environment_of,
    golden_file,
    golden_key,
    kernels_of,
    keys_of,
    loss_bound,
    metric_series,
    pick_kernels,
    platform_of,
    resolve_environment,
    snapshot_golden,
)
from harness.results import differences as inherited_differences
from harness.spec.names import EAGER, GOLDEN
from harness.spec.problems import Problem, at
from harness.spec.schema import NAME_PATTERN, ArmCase, Case, DType, LossBound, Strict

from ..golden_perf import memory_checks, step_time_check
from ..pair import Pair
from ..registry import EMULATED_LOSSES, Comparison, ContractSkipped, Judged, Planner, register
from ..series import Steps, compare_series
from ..verdicts import SWEEP_MARK, Check


class StepTimeSpec(Strict):
    """Step time against the golden values (``compare.golden.step_time``), as Megatron-LM checks
    ``iteration-time``: the median over a steady window of steps of the arm's step time (the
    slowest rank's time of each step) against the golden file's median over the same window,
    two-sided: slower by more than ``worse`` fails (a regression), faster by more than ``better``
    fails too and asks for a refresh of the golden values (the command is in the check), as
    Megatron's inference tests do with throughput. A bound left out is the golden file's
    ``rtol`` (derived from ``dcp-harness golden record --repeats N``), else the default
    (docs/internals.md, "Step time and memory bounds")."""

    # First and last step of the steady window; None: Megatron's (steps 5..20, or 30..45 when
    # the golden values run past step 25), cut to the case's steps.
    window: Optional[tuple[int, int]] = None
    worse: Optional[float] = Field(default=None, gt=0)
    better: Optional[float] = Field(default=None, gt=0)
    # Check step time on CPU ranks too. Off by default: the focused CPU cases share two cores
    # with everything else on the machine, and their step time moves by more between repeats than
    # any slowdown worth catching (docs/internals.md, "Step time and memory bounds").
    on_cpu: bool = False

    @field_validator("window")
    @classmethod
    def _ordered_window(cls, v: Optional[tuple[int, int]]) -> Optional[tuple[int, int]]:
        if v is not None and not 1 <= v[0] <= v[1]:
            raise ValueError(f"window must be [first, last] with 1 <= first <= last, got {list(v)}")
        return v


class MemorySpec(Strict):
    """Memory against the golden values (``compare.golden.memory``; CUDA runs only): allocated,
    max allocated and reserved bytes per step (largest over ranks), the graph pool of the capture
    step, and the whole device used after ``empty_cache`` at the memory probe, each two-sided
    like the step time (more than ``worse`` fails; less than ``better`` fails and asks for a
    refresh). A bound left out is the golden file's ``rtol``, else the default."""

    worse: Optional[float] = Field(default=None, gt=0)
    better: Optional[float] = Field(default=None, gt=0)


class GoldenContract(Strict):
    """One arm's per-step LM loss, aux loss and grad norm, its step time and (where CUDA recorded
    them) its memory against committed golden values, as Megatron-LM's functional tests keep them:
    ``<dir>/<case id>/golden_values_<key>.json`` (``dcp-harness golden record``), one file per
    platform (``cpu``, ``h200``, ``gb200``, ...: numerics differ between GPU generations), the key
    ``<environment>_<platform>`` when ``environment`` is set (Megatron's ``{environment}_{platform}``).
    A key without a file is skipped with the reason and the record command (an error with
    ``required: true``); a missing metric or step, or an unreadable file, is an error, never a
    pass. The sweep keeps a copy of the files as they were when it ran."""

    # Folder of the golden files, relative to the case file's folder.
    dir: str = "golden"
    arm: str = EAGER
    # Platform of the golden file; None: the platform the arm ran on (its records' ``platform``:
    # ``cpu``, or the GPU from its CUDA device name, e.g. ``h200``).
    platform: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    # Environment part of the key (``golden_values_<environment>_<platform>.json``): a name of
    # your own (``dev``, ``lts``) or ``auto``: the one the arm's records give (torch and CUDA
    # versions, ``harness.golden.environment_key``, e.g. ``torch2.11-cu13.0``); None: no
    # environment in the key (``golden_values_<platform>.json``).
    environment: Optional[str] = Field(default=None, pattern=NAME_PATTERN)
    # True: a platform without a golden file is an error (exit 2) instead of a skipped entry.
    required: bool = False
    # Bounds of the LM loss, aux loss and grad norm; None: ``exact`` for a deterministic fp32 arm
    # against a CPU golden file (the spread of its repeats where they did not agree bitwise),
    # else max_rel 1e-5, 1e-5, 1e-4 (``harness.golden.loss_bound``).
    loss: Optional[LossBound] = None
    aux_loss: Optional[LossBound] = None
    grad_norm: Optional[LossBound] = None
    # Step time (median over a steady window) and memory, two-sided; null switches one off.
    step_time: Optional[StepTimeSpec] = StepTimeSpec()
    memory: Optional[MemorySpec] = MemorySpec()


class GoldenPairParams(GoldenContract):
    """A golden pair's settings: the case's ``compare.golden`` plus what the planner resolved
    when the sweep was written: the case id, the golden folder (absolute), the case's step count
    and a copy of every golden file of the case there (key -> :class:`GoldenCopy`). Judging
    reads only these, so it gives the same answer from any directory or machine.
    ``deterministic_fp32``: the arm trains deterministically in fp32 (``train.deterministic``,
    ``train.dtype``), so on CPU it repeats bitwise."""

    case_id: str
    golden_dir: str
    steps: int = Field(ge=1)
    files: dict[str, GoldenCopy] = {}
    deterministic_fp32: bool = False
    # The arm trains deterministically (``train.deterministic``), in any dtype: on CUDA, with the
    # kernels a golden file names in full, it repeats bitwise too.
    deterministic: bool = False


class GoldenMissing(ContractSkipped):
    """No golden file for the platform (and environment) the arm ran on. Skipped with the
    command that records one, or an error when the case requires golden values
    (``compare.golden.required``)."""

    kind = "golden-platform"

    def __init__(self, case_id: str, platform: str, path: Path, recorded: Sequence[str],
                 required: bool, environment: Optional[str] = None) -> None:
        super().__init__(f"no golden values for {self.what(platform, environment)} at {path}")
        self.case_id, self.platform, self.path = case_id, platform, path
        self.environment = environment
        self.recorded, self.required = tuple(recorded), required  # required: an error, not a skip

    @staticmethod
    def what(platform: str, environment: Optional[str]) -> str:
        if environment is None:
            return f"platform '{platform}'"
        return (f"key '{golden_key(platform, environment)}' (environment '{environment}', "
                f"platform '{platform}')")

    def reason(self, sweep_dir: Optional[str]) -> str:
        have = (f" (recorded platforms: {', '.join(self.recorded)})" if self.recorded
                else " (no platform recorded yet)")
        head = ("compare.golden.required is true but there are " if self.required else "") + (
            f"no golden values for {self.what(self.platform, self.environment)} at "
            f"{self.path}{have}")
        return (f"{head}: record them from a run you trust with `dcp-harness golden record "
                f"{sweep_dir or SWEEP_MARK} --case {self.case_id} --platform {self.platform}` "
                "and commit the file")


def _kernels_line(kernels: Mapping[str, str]) -> str:
    return ", ".join(f"{kern.WHAT.get(k, k)} {v}" for k, v in sorted(kernels.items()))


def _not_bitwise(p: "GoldenPairParams", platform: str, golden: Golden, steps: Steps,
                 refresh: str) -> tuple[Optional[str], str]:
    """(why the arm need not repeat ``golden``'s loss values bitwise, None: it must; which kernels
    it shares with the file). Bitwise where the run takes the kernels the file was recorded with
    (``harness.kernels``: torch build, ATen CPU capability, BLAS ISA, threads; CUDA device,
    cuDNN, cuBLAS, TF32) and is deterministic: a deterministic fp32 arm on CPU, a deterministic
    arm on CUDA against a file that names the whole identity, or any arm whose golden file's
    repeats (``golden record --repeats N``) showed it repeats (a command)."""
    run = environment_of(steps)
    if run is None:
        return ("the arm's records name no environment, so whether it runs the golden file's "
                "kernels is not known (a command that is not started as `python ...`, or whose "
                "interpreter could not be asked, names none: the arm's log.txt says why; metrics "
                "written through the record API, harness.metrics.StepRecorder, always do)"), ""
    if golden.environment is None:
        return (f"the golden file names no environment, so whether the run takes its kernels is "
                f"not known ({refresh} here records one that does)"), ""
    recorded, full = kernels_of(golden.environment)
    now, _ = kernels_of(run)
    changed = kern.differences(recorded, now)
    if changed:
        return (f"other kernels than the golden file's ({'; '.join(changed)}): fp32 results "
                f"differ in their last bits there ({refresh} with these kernels for a bitwise "
                "bound)"), ""
    repeated = golden.repeats.get("lm loss", 1) > 1
    if platform == "cpu":
        if not (p.deterministic_fp32 or repeated):
            return ("not a deterministic fp32 arm, and no repeats in the golden file show that it "
                    f"repeats ({refresh} to show it)"), ""
    elif not full:
        return (f"the golden file predates the kernel identity: on {platform} it names only "
                f"{_kernels_line(recorded)}, not cuDNN, cuBLAS or TF32 ({refresh} records the "
                "whole one)"), ""
    elif not (p.deterministic or repeated):
        return ("not a deterministic arm (train.deterministic), and no repeats in the golden "
                f"file show that it repeats ({refresh} to show it)"), ""
    same = _kernels_line(recorded)
    left = kern.unjudged(recorded, now)
    if left:
        same += (f"; the file predates {', '.join(kern.WHAT.get(k, k) for k in left)}, not "
                 "judged")
    return None, same


def _golden_check(name: str, metric: str, run: Mapping[int, float], golden: Golden,
                  declared: Optional[LossBound], why_not: tuple[Optional[str], str], arm: str,
                  steps: int, changed: Sequence[str] = ()) -> Check:
    """``metric`` of the arm against the golden series under the case's bound ``declared``, else
    the one :func:`harness.golden.loss_bound` gives (``why_not``: :func:`_not_bitwise`);
    ``changed``: what differs from the environment the values were recorded in."""
    want = covered(golden, metric, run, arm, steps)
    bound, source, kind = loss_bound(golden, metric, declared, f"compare.golden.{name}", *why_not)
    check = compare_series(name, dict(run), dict(want), bound, (arm, f"golden {golden.path.name}"))
    env = (f"; recorded in another environment: {'; '.join(changed)}" if changed else "")
    return replace(check, detail=f"{check.detail} against {golden.path.name} (bound: {source}){env}",
                   bound_kind=kind)


def judged_file(p: GoldenPairParams, steps: Steps) -> tuple[str, Golden]:
    """(platform, values) of the golden file the arm's records are judged against: of the
    sweep's copies of the files of the key the arm ran on (the key's own and those of other
    kernel identities beside it, ``golden_values_<key>.<variant>.json``), the one recorded with
    the run's kernels, else the key's own (``harness.golden.pick_kernels``). No file for that
    key: :class:`GoldenMissing`; an unreadable one: GoldenError."""
    platform = p.platform or platform_of(steps)
    environment = resolve_environment(p.environment, steps)
    keys = keys_of(p.files, golden_key(platform, environment))
    if not keys:
        raise GoldenMissing(p.case_id, platform,
                            golden_file(p.golden_dir, p.case_id, platform, environment),
                            sorted(p.files), p.required, environment)
    return platform, pick_kernels([p.files[k].golden() for k in keys], environment_of(steps))


def recorded_differences(golden: Golden, steps: Steps,
                         inherited_env: Optional[Mapping[str, str]] = None) -> list[str]:
    """What differs between the environment the golden values were recorded in and the arm's,
    one phrase each: the versions, device and settings its records name
    (``harness.environment.differences``: ``NCCL_ALGO Ring -> Tree``), then the variables a
    command inherited (``inherited_env``: the arm's ``inherited_env.json``) against the file's
    (``NAME=x (golden) vs NAME=y (this sweep)``); empty where nothing differs or neither side
    recorded it."""
    out: list[str] = []
    run = environment_of(steps)
    if golden.environment is not None and run is not None:
        out += env_differences(golden.environment, run)
    if golden.inherited_env is not None and inherited_env is not None:
        out += inherited_differences(golden.inherited_env, inherited_env,
                                     ("golden", "this sweep"))
    return out


def moved_arm(golden: Golden, arm: str, case_id: str, platform: str) -> Optional[str]:
    """Why values recorded from another arm are no golden values of ``arm`` (None: the file
    names ``arm``, or no arm: recorded before dcp-harness kept it)."""
    if golden.arm is None or golden.arm == arm:
        return None
    return (f"{golden.path}: the golden values were recorded from arm '{golden.arm}', but "
            f"compare.golden.arm judges arm '{arm}' (the golden arm moved): values of one arm are "
            f"no golden values of another; re-record them from a run you trust with `dcp-harness "
            f"golden record {SWEEP_MARK} --case {case_id} --platform {platform}` and commit the "
            "file")


def check_golden(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """One arm against its committed golden values (``compare.golden``; ``harness.golden``):
    LM loss, aux loss and grad norm per step, step time and memory two-sided, against the
    sweep's copy of the file of the key the arm ran on. No file for that key:
    :class:`GoldenMissing` (skipped, or an error when required); a missing metric or step, an
    unreadable file, or a file recorded from another arm (:func:`moved_arm`) raises
    GoldenError: an error, never a pass."""
    p: GoldenPairParams = pair.params
    if len(pair.arms) != 1:
        raise ValueError(f"pair '{pair.name}' (golden) needs exactly 1 arm, got {list(pair.arms)}")
    arm = pair.arms[0]
    steps = data[arm]
    platform, values = judged_file(p, steps)
    moved = moved_arm(values, arm, p.case_id, platform)
    if moved is not None:
        raise GoldenError(moved)
    refresh = (f"`dcp-harness golden record {SWEEP_MARK} --case {p.case_id} --platform {platform} "
               f"--repeats {max(3, max(values.repeats.values(), default=1))}`")
    why_not = _not_bitwise(p, platform, values, steps, refresh)
    changed = recorded_differences(values, steps)
    # A series the plan marks not applicable (e.g. a command whose metrics have no aux loss) is
    # recorded as such with the plan's reason, never looked up in a file that cannot have it.
    absent = pair.not_applicable_checks
    checks = [Check.not_applicable(name, absent[name]) if name in absent else
              _golden_check(name, metric, metric_series(steps, metric), values, bound, why_not,
                            arm, p.steps, changed)
              for name, metric, bound in (("loss", "lm loss", p.loss),
                                          ("aux_loss", "aux loss", p.aux_loss),
                                          ("grad_norm", "grad norm", p.grad_norm))]
    checks.append(step_time_check(p, arm, steps, values, refresh))
    checks.extend(memory_checks(p, arm, steps, values, refresh))
    return tuple(checks)


def golden_dir(case: Case) -> Path:
    """Folder of the case's golden files, absolute: ``compare.golden.dir`` relative to the case
    file's folder (resolved from the current directory, as the case file's path was given)."""
    spec = case.compare.golden
    assert spec is not None
    return (Path(case.source).parent / spec.dir).resolve()


def _deterministic_fp32(arm_case: ArmCase) -> bool:
    """Whether the arm trains deterministically in fp32 (on CPU it repeats bitwise). A command's
    ``train`` section does not describe its training: its golden file's repeats must show it."""
    return _deterministic(arm_case) and arm_case.train.dtype is DType.FP32


def _deterministic(arm_case: ArmCase) -> bool:
    """Whether the built-in workload trains the arm deterministically (``train.deterministic``;
    never known for a command)."""
    return arm_case.command is None and arm_case.train.deterministic


class GoldenComparison(Comparison):
    name = GOLDEN
    settings = GoldenContract
    order = 60
    judged = {GOLDEN: Judged(GoldenPairParams, check_golden)}
    emulated_skip = (f"not run for emulated ranks: {EMULATED_LOSSES}; golden values are the "
                     "model's losses")

    def rules(self, case: Case, settings: GoldenContract) -> list[Problem]:
        """A folder relative to the case file's; a step-time window the run reaches, whole (a
        window cut to the steps would judge other steps than the case says)."""
        problems = []
        if Path(settings.dir).is_absolute():
            problems.append(Problem(at("compare.golden.dir"), (
                f"{settings.dir} is absolute; golden files are committed next to the case files, "
                "so give a folder relative to the case file's folder (e.g. golden)")))
        window = settings.step_time.window if settings.step_time is not None else None
        if window is not None and window[1] > case.train.steps:
            problems.append(Problem(at("compare.golden.step_time.window"), (
                f"steps {window[0]}..{window[1]} run past the last of the {case.train.steps} "
                f"train.steps: end the window at step {case.train.steps} at most (or run more "
                "steps)")))
        return problems

    def plan(self, case: Case, settings: GoldenContract, planner: Planner) -> list[Pair]:
        """One pair of one arm; the case's golden files are copied into the plan now
        (``harness.golden.snapshot_golden``, the only files it reads)."""
        name = planner.arm(settings.arm, "compare.golden.arm")
        where = golden_dir(case)
        params = GoldenPairParams(**{**dict(settings), "arm": name}, case_id=case.id,
                                  golden_dir=str(where), steps=case.train.steps,
                                  files=snapshot_golden(where, case.id),
                                  deterministic_fp32=_deterministic_fp32(planner.case_of(name)),
                                  deterministic=_deterministic(planner.case_of(name)))
        return [Pair(GOLDEN, GOLDEN, (name,), params)]


register(GoldenComparison())
