"""Environment notes of a sweep, for ``gate`` and ``summary.md``: where two runs that a verdict
compares ran in environments that differ outside the case.

* a pair whose two arms inherited different environments (command arms record theirs,
  ``<arm>/inherited_env.json``: ``harness.results.inherited_env``): a variable set in the shell
  of one invocation but not the other can change the training outside the case;
* a golden pair whose arm ran in another environment than its golden values were recorded in:
  the versions, device and settings (``NCCL_ALGO`` ...) the records name, and the variables a
  command inherited, against those the golden file keeps
  (``harness.compare.recorded_differences``).

One line per pair, the first :data:`SHOWN` differences and how many more.
"""

from __future__ import annotations

from typing import Optional

from harness.compare import GoldenMissing, GoldenPairParams, judged_file, recorded_differences
from harness.results import differences, read_arm_env
from harness.spec.names import GOLDEN

from .load import CaseView, SweepView

SHOWN = 6


def _listed(diff: list[str]) -> str:
    more = f"; and {len(diff) - SHOWN} more" if len(diff) > SHOWN else ""
    return "; ".join(diff[:SHOWN]) + more


def _golden_note(case: CaseView, arm: str) -> Optional[str]:
    """What differs between the golden file the arm is judged against and the arm's run."""
    if case.plan is None or arm not in case.arms:
        return None
    pair = next((q for q in case.plan.pairs if q.contract == GOLDEN and q.arms == (arm,)), None)
    if pair is None or not isinstance(pair.params, GoldenPairParams):
        return None
    steps = case.arms[arm].steps
    try:
        _, golden = judged_file(pair.params, steps)
    except (GoldenMissing, ValueError):  # GoldenError too: the verdict says so
        return None
    diff = recorded_differences(golden, steps, read_arm_env(case.dir / arm))
    if not diff:
        return None
    return (f"arm '{arm}' ran in another environment than its golden values "
            f"({golden.path.name}) were recorded in: {_listed(diff)}")


def environment_notes(sweep: SweepView) -> list[str]:
    """``<case> / <pair>: <what differs>``, one per pair where something does (module doc), in
    the sweep's row order."""
    notes = []
    for case, p in sweep.rows:
        if p.contract == GOLDEN and len(p.arms) == 1:
            note = _golden_note(case, p.arms[0])
            if note is not None:
                notes.append(f"{case.title} / {p.pair}: {note}")
            continue
        if len(p.arms) != 2:
            continue
        envs = [read_arm_env(case.dir / arm) for arm in p.arms]
        if envs[0] is None or envs[1] is None:
            continue
        diff = differences(envs[0], envs[1], (p.arms[0], p.arms[1]))
        if diff:
            notes.append(f"{case.title} / {p.pair}: the arms inherited different environments "
                         f"(inherited_env.json): {_listed(diff)}")
    return notes
