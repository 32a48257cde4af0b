"""``resume``: an arm stopped by the harness after a step and started again from that step's
checkpoint (``<arm>-resumed``) against the same arm run without a stop (``compare.resume``), as
Megatron-LM's ``ckpt-resume`` tests compare the resumed run with the uninterrupted one over the
steps after the resume.

Checks: ``resumed_after`` (every rank's first record after the stop says it was written by a
process that resumed after that step: the arm really stopped and resumed there), and
independently of it ``loaded_checkpoint`` (the checkpoint that process loaded holds that step by
its own metadata, ``StepRecord.checkpoint_step``, not by the file name the ranks agreed on); for a
graph arm also that it captured its graphs again on that step (``recaptured``);
``loss_before_stop`` (the two runs are one configuration until the stop), and ``loss``,
``aux_loss``, ``grad_norm`` on every step after the stop (``exact`` = bitwise)."""

from __future__ import annotations

from typing import Mapping

from pydantic import Field

from harness.results import StepRecord
from harness.spec.names import RESUME
from harness.spec.schema import ResumeContract

from ..pair import Pair
from ..registry import contract
from ..series import Steps, series_check_on
from ..verdicts import Check


class ResumePairParams(ResumeContract):
    """A resume pair's settings: the case's ``compare.resume`` plus the step the planner stops
    the candidate arm after (``at_step``, else half the steps)."""

    after: int = Field(ge=1)


def _first_after(steps: Steps, after: int) -> dict[int, StepRecord]:
    """Rank -> its record of step ``after + 1`` (ranks without one left out)."""
    out = {}
    for rank in sorted(steps):
        for rec in steps[rank]:
            if rec.step == after + 1:
                out[rank] = rec
                break
    return out


def _no_step_after(name: str, arm: str, after: int) -> Check:
    return Check(name, None, 0.0, False,
                 f"arm '{arm}' recorded no step {after + 1} (the step after the stop)")


def _resumed_check(arm: str, steps: Steps, after: int) -> Check:
    records = _first_after(steps, after)
    if not records:
        return _no_step_after("resumed_after", arm, after)
    wrong = []
    for rank, rec in records.items():
        got = rec.resumed_from
        if got != after:
            how = "started from step 1" if got is None else f"resumed after step {got}"
            wrong.append(f"rank {rank}: step {after + 1} was written by a process that {how}")
    detail = (f"every rank's step {after + 1} came from a process that loaded the checkpoint of "
              f"step {after}" if not wrong else "; ".join(wrong) + f" (expected: resumed after "
                                                                    f"step {after})")
    return Check("resumed_after", float(len(wrong)), 0.0, not wrong, detail)


def _loaded_check(arm: str, steps: Steps, after: int) -> Check:
    """The checkpoint behind every rank's step ``after + 1`` holds step ``after`` by its own
    metadata (``StepRecord.checkpoint_step``)."""
    records = _first_after(steps, after)
    if not records:
        return _no_step_after("loaded_checkpoint", arm, after)
    wrong = []
    for rank, rec in records.items():
        got = rec.checkpoint_step
        if got != after:
            how = ("loaded no checkpoint (or its records name none)" if got is None
                   else f"loaded a checkpoint that holds step {got}")
            wrong.append(f"rank {rank}: step {after + 1} was written by a process that {how}")
    detail = (f"every rank's step {after + 1} came from a process that loaded a checkpoint "
              f"holding step {after} (its own metadata)" if not wrong
              else "; ".join(wrong) + f" (expected: a checkpoint of step {after})")
    return Check("loaded_checkpoint", float(len(wrong)), 0.0, not wrong, detail)


def _recaptured_check(arm: str, steps: Steps, after: int) -> Check:
    records = _first_after(steps, after)
    if not records:
        return _no_step_after("recaptured", arm, after)
    missing = [r for r, rec in records.items() if rec.graph_stats is None]
    detail = (f"every rank captured its graphs again on step {after + 1}, after the resume" if not
              missing else f"rank(s) {', '.join(map(str, missing))} of arm '{arm}' replayed step "
                           f"{after + 1} without capturing after the resume")
    return Check("recaptured", float(len(missing)), 0.0, not missing, detail)


@contract(RESUME, ResumePairParams)
def resume(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: ResumePairParams = pair.params
    arms = pair.two_arms()  # (resumed, uninterrupted)
    k = p.after
    aux = p.aux_loss if p.aux_loss is not None else p.loss
    grad = p.grad_norm if p.grad_norm is not None else p.loss
    after = f"after the stop at step {k}"
    checks = [_resumed_check(arms[0], data[arms[0]], k), _loaded_check(arms[0], data[arms[0]], k)]
    # A graph arm that captured before the stop: it must capture again on the step after it.
    if any(rec.step <= k and rec.graphed for recs in data[arms[0]].values() for rec in recs):
        checks.append(_recaptured_check(arms[0], data[arms[0]], k))
    checks += [
        series_check_on("loss_before_stop", "loss", data, arms, p.loss, lambda s: s <= k,
                        f"steps up to the stop at step {k} (one configuration)"),
        series_check_on("loss", "loss", data, arms, p.loss, lambda s: s > k, after),
        series_check_on("aux_loss", "aux_loss", data, arms, aux, lambda s: s > k, after),
        series_check_on("grad_norm", "grad_norm", data, arms, grad, lambda s: s > k, after),
    ]
    return tuple(checks)
