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

from pydantic import Field

from harness.environment import differences
from harness.golden import (
    Golden,
    GoldenCopy,
    covered,
    environment_of,
    golden_file,
    golden_key,
    loss_bound,
    metric_series,
    platform_of,
    resolve_environment,
)
from harness.spec.names import GOLDEN
from harness.spec.schema import GoldenContract, LossBound

from ..pair import Pair
from ..registry import ContractSkipped, contract
from ..series import Steps, compare_series
from ..verdicts import SWEEP_MARK, Check
from ..golden_perf import memory_checks, step_time_check


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


def _not_bitwise(deterministic_fp32: bool, platform: str, golden: Golden, steps: Steps,
                 refresh: str) -> Optional[str]:
    """Why the arm need not repeat ``golden``'s loss values bitwise (None: it must): only a
    deterministic fp32 run on CPU in the environment the file was recorded in (the same torch,
    CPU and thread settings: CPU kernels round differently on other CPUs) repeats them."""
    if platform != "cpu" or not deterministic_fp32:
        return "not a deterministic fp32 run on CPU"
    run = environment_of(steps)
    if golden.environment is None or run is None:
        return (f"{'the golden file' if golden.environment is None else 'the run'} names no "
                f"environment, so whether the run repeats it bitwise is not known ({refresh} "
                "here records one that does)")
    changed = differences(golden.environment, run)
    if changed:
        return (f"recorded in another environment ({', '.join(changed)}): fp32 kernels round "
                f"differently there ({refresh} here for a bitwise bound)")
    return None


def _golden_check(name: str, metric: str, run: Mapping[int, float], golden: Golden,
                  declared: Optional[LossBound], why_not: Optional[str], arm: str,
                  steps: int) -> Check:
    """``metric`` of the arm against the golden series under the case's bound ``declared``, else
    the one :func:`harness.golden.loss_bound` gives (``why_not``: :func:`_not_bitwise`)."""
    want = covered(golden, metric, run, arm, steps)
    bound, source = loss_bound(golden, metric, declared, f"compare.golden.{name}", why_not)
    check = compare_series(name, dict(run), dict(want), bound, (arm, f"golden {golden.path.name}"))
    return replace(check, detail=f"{check.detail} (bound: {source})")


@contract(GOLDEN, GoldenPairParams)
def golden(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """One arm against its committed golden values (``compare.golden``; ``harness.golden``):
    LM loss, aux loss and grad norm per step, step time and memory two-sided, against the
    sweep's copy of the file of the key the arm ran on. No file for that key:
    :class:`GoldenMissing` (skipped, or an error when required); a missing metric or step, or an
    unreadable file, raises GoldenError: an error, never a pass."""
    p: GoldenPairParams = pair.params
    if len(pair.arms) != 1:
        raise ValueError(f"pair '{pair.name}' (golden) needs exactly 1 arm, got {list(pair.arms)}")
    arm = pair.arms[0]
    steps = data[arm]
    platform = p.platform or platform_of(steps)
    environment = resolve_environment(p.environment, steps)
    copy = p.files.get(golden_key(platform, environment))
    if copy is None:
        raise GoldenMissing(p.case_id, platform,
                            golden_file(p.golden_dir, p.case_id, platform, environment),
                            sorted(p.files), p.required, environment)
    values = copy.golden()
    refresh = (f"`dcp-harness golden record {SWEEP_MARK} --case {p.case_id} --platform {platform} "
               f"--repeats {max(3, max(values.repeats.values(), default=1))}`")
    why_not = _not_bitwise(p.deterministic_fp32, platform, values, steps, refresh)
    # A series the plan marks not applicable (e.g. a command whose metrics have no aux loss) is
    # recorded as such with the plan's reason, never looked up in a file that cannot have it.
    absent = pair.not_applicable_checks
    checks = [Check.not_applicable(name, absent[name]) if name in absent else
              _golden_check(name, metric, metric_series(steps, metric), values, bound, why_not,
                            arm, p.steps)
              for name, metric, bound in (("loss", "lm loss", p.loss),
                                          ("aux_loss", "aux loss", p.aux_loss),
                                          ("grad_norm", "grad norm", p.grad_norm))]
    checks.append(step_time_check(p, arm, steps, values, refresh))
    checks.extend(memory_checks(p, arm, steps, values, refresh))
    return tuple(checks)
