"""``golden``: one arm against its committed golden values (``compare.golden``;
``harness.golden`` keeps the files, Megatron-LM's layout).

LM loss, aux loss and grad norm of the lowest rank per step, and memory (largest over ranks; not
applicable without CUDA figures) against the sweep plan's copy of the golden file of the platform
the arm ran on. No file for that platform: :class:`GoldenMissing` (skipped with the command that
records one, or an error with ``compare.golden.required``); a missing metric or step, or an
unreadable file, raises GoldenError: an error, never a pass."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping, Optional, Sequence

from pydantic import Field

from harness.golden import (
    MEMORY_METRICS,
    Golden,
    GoldenCopy,
    GoldenError,
    golden_file,
    loss_series,
    memory_series,
    platform_of,
)
from harness.spec.schema import GoldenContract, LossBound
from harness.textfmt import collapse_runs

from ..pair import Pair
from ..registry import ContractSkipped, contract
from ..series import Steps, compare_series
from ..verdicts import Check


class GoldenPairParams(GoldenContract):
    """A golden pair's settings: the case's ``compare.golden`` plus what the planner resolved
    when the sweep was written: the case id, the golden folder (absolute), the case's step count
    and a copy of every golden file of the case there (platform -> :class:`GoldenCopy`). Judging
    reads only these, so it gives the same answer from any directory or machine."""

    case_id: str
    golden_dir: str
    steps: int = Field(ge=1)
    files: dict[str, GoldenCopy] = {}


class GoldenMissing(ContractSkipped):
    """No golden file for the platform the arm ran on. Skipped with the command that records
    one, or an error when the case requires golden values (``compare.golden.required``)."""

    def __init__(self, case_id: str, platform: str, path: Path, recorded: Sequence[str],
                 required: bool) -> None:
        super().__init__(f"no golden values for platform '{platform}' at {path}")
        self.case_id, self.platform, self.path = case_id, platform, path
        self.recorded, self.required = tuple(recorded), required  # required: an error, not a skip

    def reason(self, sweep_dir: Optional[str]) -> str:
        have = (f" (recorded platforms: {', '.join(self.recorded)})" if self.recorded
                else " (no platform recorded yet)")
        head = ("compare.golden.required is true but there are " if self.required else "") + (
            f"no golden values for platform '{self.platform}' at {self.path}{have}")
        return (f"{head}: record them from a run you trust with `dcp-harness golden record "
                f"{sweep_dir or '<sweep>'} --case {self.case_id} --platform {self.platform}` "
                "and commit the file")


def _golden_check(name: str, metric: str, run: Mapping[int, float], golden: Golden,
                  bound: LossBound, arm: str, steps: int) -> Check:
    """``metric`` of the arm against the golden series. The golden must cover the case's steps
    (``steps``); steps the arm did not record (it crashed) are left to its completeness check."""
    want = golden.series(metric)
    if want and max(want) != steps:
        raise GoldenError(f"{golden.path}: '{metric}' runs to step {max(want)}, the case to "
                          f"train.steps {steps} (train.steps changed? re-record it)")
    if set(run) - set(want):
        raise GoldenError(f"{golden.path}: '{metric}' has no value for step(s) "
                          f"{collapse_runs(sorted(set(run) - set(want)))} of arm '{arm}' (the case "
                          "changed? re-record it)")
    return compare_series(name, dict(run), dict(want), bound, (arm, f"golden {golden.path.name}"))


@contract("golden", GoldenPairParams)
def golden(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    """One arm against its committed golden values (``compare.golden``; ``harness.golden``):
    LM loss, aux loss and grad norm per step, and memory (largest over ranks) where the run
    recorded it, against the sweep's copy of the file of the platform the arm ran on. No file for
    that platform: :class:`GoldenMissing` (skipped, or an error when required); a missing metric
    or step, or an unreadable file, raises GoldenError: an error, never a pass."""
    p: GoldenPairParams = pair.params
    if len(pair.arms) != 1:
        raise ValueError(f"pair '{pair.name}' (golden) needs exactly 1 arm, got {list(pair.arms)}")
    arm = pair.arms[0]
    steps = data[arm]
    platform = p.platform or platform_of(steps)
    copy = p.files.get(platform)
    if copy is None:
        raise GoldenMissing(p.case_id, platform, golden_file(p.golden_dir, p.case_id, platform),
                            sorted(p.files), p.required)
    values = copy.golden()
    checks = [_golden_check(name, metric, loss_series(steps, metric), values, bound, arm, p.steps)
              for name, metric, bound in (("loss", "lm loss", p.loss),
                                          ("aux_loss", "aux loss", p.aux_loss),
                                          ("grad_norm", "grad norm", p.grad_norm))]
    for metric in MEMORY_METRICS:
        run = memory_series(steps, metric)
        name = metric.replace("-", "_")
        if p.memory is None:
            checks.append(Check.not_applicable(name, "compare.golden.memory is null"))
        elif not run:
            checks.append(Check.not_applicable(name, f"arm '{arm}' recorded no device memory (CPU)"))
        else:
            checks.append(_golden_check(name, metric, run, values, p.memory, arm, p.steps))
    return tuple(checks)
