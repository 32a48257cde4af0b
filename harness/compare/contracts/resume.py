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

from dataclasses import replace
from typing import Callable, Mapping, Optional

from pydantic import Field

from harness.results import StepRecord
from harness.spec.limits import limit
from harness.spec.names import EAGER, GRAPH, RESUME, pair_name
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, LossBound, Strict

from ..pair import Pair
from ..registry import Comparison, Judged, Planner, register
from ..resume_state import state_checks
from ..series import Steps, series_check_on
from ..verdicts import Check


class ResumeContract(Strict):
    """Resume consistency, as Megatron-LM's ``ckpt-resume`` tests: each arm (``arms``; default the
    eager arm, and ``graph`` in a graph case, whose graphs are captured again after the resume) is
    run a second time as ``<arm>-resumed``, stopped by the harness after step ``at_step``
    (its processes exit after saving their checkpoint) and started again from that checkpoint;
    from the step after it on, its LM loss, aux loss and grad norm must match the uninterrupted
    arm's (``exact`` = bitwise, which needs ``train.deterministic``)."""

    arms: Optional[list[str]] = Field(default=None, min_length=1)
    # Step after which the arm is stopped; None: half the steps (train.steps // 2, at least 1).
    at_step: Optional[int] = Field(default=None, ge=1, le=limit("train.steps"))
    loss: LossBound = "exact"
    # Bounds of the aux loss and grad norm; None: the loss bound.
    aux_loss: Optional[LossBound] = None
    grad_norm: Optional[LossBound] = None

    def step(self, steps: int) -> int:
        """The step after which the arm is stopped (``at_step``, else half of ``steps``)."""
        return self.at_step if self.at_step is not None else max(1, steps // 2)

    def arm_names(self, graph_case: bool) -> list[str]:
        """The arms resumed: ``arms``, else the eager arm and, in a graph case, ``graph``."""
        return list(self.arms) if self.arms is not None else [EAGER] + ([GRAPH] if graph_case else [])


class ResumePairParams(ResumeContract):
    """A resume pair's settings: the case's ``compare.resume`` plus the step the plan stops
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


def _after_stop_check(name: str, arm: str, steps: Steps, after: int,
                      got: Callable[[StepRecord], Optional[int]],
                      how: Callable[[Optional[int]], str], agreed: str, expected: str) -> Check:
    """Every rank's step ``after + 1`` says ``after`` by ``got`` (the value a resumed process
    stamps on its records); ``how(value)`` says what a process that did not did, ``agreed`` and
    ``expected`` what the detail says when all did and what was expected."""
    records = _first_after(steps, after)
    if not records:
        return _no_step_after(name, arm, after)
    wrong = [f"rank {rank}: step {after + 1} was written by a process that {how(got(rec))}"
             for rank, rec in records.items() if got(rec) != after]
    detail = (f"every rank's step {after + 1} came from a process that {agreed}" if not wrong
              else "; ".join(wrong) + f" (expected: {expected})")
    return Check(name, float(len(wrong)), 0.0, not wrong, detail)


def _resumed_check(arm: str, steps: Steps, after: int) -> Check:
    """Every rank's step ``after + 1`` came from a process that resumed after step ``after``
    (``StepRecord.resumed_from``)."""
    return _after_stop_check(
        "resumed_after", arm, steps, after, lambda rec: rec.resumed_from,
        lambda got: "started from step 1" if got is None else f"resumed after step {got}",
        f"loaded the checkpoint of step {after}", f"resumed after step {after}")


def _loaded_check(arm: str, steps: Steps, after: int) -> Check:
    """The checkpoint behind every rank's step ``after + 1`` holds step ``after`` by its own
    metadata (``StepRecord.checkpoint_step``)."""
    return _after_stop_check(
        "loaded_checkpoint", arm, steps, after, lambda rec: rec.checkpoint_step,
        lambda got: ("loaded no checkpoint (or its records name none)" if got is None
                     else f"loaded a checkpoint that holds step {got}"),
        f"loaded a checkpoint holding step {after} (its own metadata)",
        f"a checkpoint of step {after}")


def _recaptured_check(arm: str, steps: Steps, after: int) -> Check:
    records = _first_after(steps, after)
    if not records:
        return _no_step_after("recaptured", arm, after)
    missing = [r for r, rec in records.items() if rec.graph_stats is None]
    detail = (f"every rank captured its graphs again on step {after + 1}, after the resume" if not
              missing else f"rank(s) {', '.join(map(str, missing))} of arm '{arm}' replayed step "
                           f"{after + 1} without capturing after the resume")
    return Check("recaptured", float(len(missing)), 0.0, not missing, detail)


def check_resume(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
    p: ResumePairParams = pair.params
    arms = pair.two_arms()  # (resumed, uninterrupted)
    k = p.after
    aux = p.aux_loss if p.aux_loss is not None else p.loss
    grad = p.grad_norm if p.grad_norm is not None else p.loss
    after = f"after the stop at step {k}"
    checks = [_resumed_check(arms[0], data[arms[0]], k), _loaded_check(arms[0], data[arms[0]], k)]
    checks += state_checks(arms[0], data[arms[0]], k)  # optimizer and RNG state (resume_state)
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


class Resume(Comparison):
    name = RESUME
    settings = ResumeContract
    order = 70
    judged = {RESUME: Judged(ResumePairParams, check_resume)}
    emulated_skip = ("not run for emulated ranks: the launcher does not stop and resume an "
                     "emulated rank (run the case without emulate.ranks)")
    not_for_commands = "a command's stop and resume is not planned yet"

    def rules(self, case: Case, settings: ResumeContract) -> list[Problem]:
        """(Built-in workload) a stop step inside the run, bitwise only when deterministic, and
        for graph arms a stop after the capture (so the resumed arm captures its graphs again)."""
        t = case.train
        if case.command is not None:
            return []
        problems: list[Problem] = []
        stop = settings.step(t.steps)
        if not 1 <= stop < t.steps:
            problems.append(Problem(at("compare.resume.at_step"), (
                f"the arm is stopped after step {stop} and must resume before the last of the "
                f"{t.steps} train.steps: use 1 <= at_step < {t.steps} (or more steps)")))
        exact = [f for f in ("loss", "aux_loss", "grad_norm") if getattr(settings, f) == "exact"]
        if not t.deterministic and exact:
            problems.append(Problem(at(f"compare.resume.{exact[0]}"), (
                "an exact resume check needs train.deterministic: true (or give a tolerance)")))
        graph_arms = [a for a in settings.arm_names(case.graphs is not None) if a.startswith(GRAPH)]
        if case.graphs is not None and graph_arms and stop <= case.graphs.warmup_steps:
            warmup = case.graphs.warmup_steps
            problems.append(Problem(at("compare.resume.at_step"), (
                f"the graph arm captures after its {warmup} eager warmup steps; stopping it after "
                f"step {stop} resumes before any capture, so the recapture on resume is not "
                f"tested: use at_step > {warmup}")))
        return problems

    def plan(self, case: Case, settings: ResumeContract, planner: Planner) -> list[Pair]:
        """Each arm (default the eager arm, and ``graph`` with ``graphs:``) and its ``-resumed``
        twin (``Execution.interrupt_after``), one pair each: ``resume``, ``resume-<arm>``."""
        field = "compare.resume.arms"
        after = settings.step(case.train.steps)
        pairs: list[Pair] = []
        wanted = settings.arm_names(case.graphs is not None)
        for name in dict.fromkeys(planner.arm(a, field) for a in wanted):
            twin = planner.add(replace(planner.spec_of(name), resumed_at=after))
            params = ResumePairParams(**dict(settings), after=after)
            pairs.append(Pair(pair_name(RESUME, len(pairs), name), RESUME, (twin, name), params))
        return pairs


register(Resume())
