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
``aux_loss``, ``grad_norm`` on every step after the stop (``exact`` = bitwise); a series check
that fails names every step that differs (``differs at steps 12 (a vs b), ...``), so a resume
whose difference is one logged iteration reads apart from one whose state was lost.

A command case (``command.resume``) runs its ``-resumed`` arm twice, the first run saving after
step ``at_step`` and exiting, the second loading (``harness.launch.ranks.command_resume``): its
``resumed_after`` is the step before the second run's first logged iteration, its
``loaded_checkpoint`` what ``command.resume.iteration_file`` said between the runs (n/a with the
reason when the case names none and the metrics carry none)."""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Callable, Mapping, Optional, Sequence

from pydantic import Field

from harness.results import StepRecord
from harness.spec.derive import has_graph_arms
from harness.spec.limits import limit
from harness.spec.names import EAGER, GRAPH, RESUME, pair_name
from harness.spec.problems import Problem, at
from harness.spec.schema import Case, LossBound, Strict
from harness.spec.source_facts import not_mapped, source_facts

from ..pair import Pair
from ..pair_memory import GROWTH_DEFAULT_PCT, level_check
from ..registry import Comparison, Judged, Planner, register
from ..resume_state import state_checks
from ..series import Steps, fmt_value, records_of, same_bits, series_check_on, step_series
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
    # The learning rate on every step after the stop (a schedule that restarts after the load
    # shows here first, even on the last step, where no later loss can show it).
    lr: LossBound = "exact"
    # Allocated bytes at each step after the stop both arms recorded, resumed minus
    # uninterrupted, in % of the uninterrupted arm's (a leak that only a loaded run has);
    # None: a figure. By default golden memory's bound.
    allocated_after_load_pct: Optional[float] = Field(default=GROWTH_DEFAULT_PCT, ge=0)

    def step(self, steps: int) -> int:
        """The step after which the arm is stopped (``at_step``, else half of ``steps``)."""
        return self.at_step if self.at_step is not None else max(1, steps // 2)

    def arm_names(self, graph_case: bool) -> list[str]:
        """The arms resumed: ``arms``, else the eager arm and, in a graph case, ``graph``."""
        return list(self.arms) if self.arms is not None else [EAGER] + ([GRAPH] if graph_case else [])


class ResumePairParams(ResumeContract):
    """A resume pair's settings: the case's ``compare.resume`` plus the step the plan stops
    the candidate arm after (``at_step``, else half the steps), and whether its losses come from
    Megatron's log lines (``megatron_log``: the resumed run's line of step ``after + 2`` may be
    the mean of its first two iterations, :func:`check_first_interval`)."""

    after: int = Field(ge=1)
    log_lines: bool = False


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


# How many differing steps a failed series check names (then "and N more").
_LISTED_STEPS = 8


def differing_steps(key: str, data: Mapping[str, Steps], arms: tuple[str, str],
                    keep: Callable[[int], bool]) -> str:
    """``differs at steps 12 (a vs b), 14 (...)``: every step ``keep`` accepts whose ``key``
    is not bitwise the same in both arms (empty when none)."""
    cand, ref = step_series(data[arms[0]], key), step_series(data[arms[1]], key)
    steps = [s for s in sorted(set(cand) & set(ref)) if keep(s) and not (
        cand[s] is not None and ref[s] is not None and same_bits(cand[s], ref[s]))]
    if not steps:
        return ""
    shown = ", ".join(f"{s} ({fmt_value(cand[s])} vs {fmt_value(ref[s])})"
                      for s in steps[:_LISTED_STEPS])
    more = f" and {len(steps) - _LISTED_STEPS} more" if len(steps) > _LISTED_STEPS else ""
    return f"differs at step{'s' if len(steps) > 1 else ''} {shown}{more}"


def _series(name: str, key: str, data: Mapping[str, Steps], arms: tuple[str, str],
            bound: LossBound, keep: Callable[[int], bool], what: str) -> Check:
    """``series_check_on``, a failed one naming every step that differs."""
    check = series_check_on(name, key, data, arms, bound, keep, what)
    if check.passed or check.value is None:
        return check
    where = differing_steps(key, data, arms, keep)
    return replace(check, detail=f"{check.detail}; {where}") if where else check


def _printed_unit(value: float) -> float:
    """One unit in the last place of Megatron's ``{:.6E}``: ``10 ** (exponent - 6)``."""
    return 10.0 ** (math.floor(math.log10(abs(value))) - 6) if value else 1e-6


def check_first_interval(name: str, key: str, data: Mapping[str, Steps], arms: tuple[str, str],
                         step: int) -> Check:
    """The resumed run's log line of ``step`` (its second iteration): Megatron's ``training_log``
    does not reset its loss sums after a run's first iteration (``is_first_iteration``), so that
    line prints the mean of the run's first two iterations (``step - 1`` and ``step``), where the
    uninterrupted run printed ``step`` alone (it did the same on its own step 2). Passes when the
    value is bitwise the uninterrupted run's (a log that prints each iteration alone) or that
    mean of the uninterrupted run's two printed values, to within what printing them rounded
    (one unit in the last printed place); fails otherwise, naming the step and the values."""
    cand, ref = step_series(data[arms[0]], key), step_series(data[arms[1]], key)
    got, one, two = cand.get(step), ref.get(step - 1), ref.get(step)
    if got is None or one is None or two is None:
        return Check(name, None, 0.0, False, f"step {step}: no {key.replace('_', ' ')} of "
                     f"{'the resumed run' if got is None else 'the uninterrupted run'} to compare")
    if same_bits(got, two):
        return Check(name, 0.0, 0.0, True, f"step {step}: bitwise the uninterrupted run's "
                                           f"{fmt_value(two)} (a line per iteration)")
    mean = (one + two) / 2
    unit = _printed_unit(mean)
    off = abs(got - mean)
    passed = off <= unit
    return Check(name, off, unit, passed, (
        f"step {step}: {fmt_value(got)} (resumed) is the mean of the uninterrupted run's steps "
        f"{step - 1} and {step} ({fmt_value(one)}, {fmt_value(two)}: {mean:.9g}) to within the "
        f"log's printed precision ({unit:.0e}): Megatron's line after a run's first iteration "
        f"averages its first two (training_log does not reset after the first iteration), the "
        f"same on the uninterrupted run's step 2" if passed else
        f"step {step}: {fmt_value(got)} (resumed) is neither the uninterrupted run's "
        f"{fmt_value(two)} nor the mean of its steps {step - 1} and {step} ({mean:.9g}, "
        f"off by {off:.2g}, more than the log's printed precision {unit:.0e})"))


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
    # Megatron's log line of the second run's second iteration is an average (check_first_interval).
    mean_at = k + 2 if p.log_lines and any(r.step == k + 2 for _, r in records_of(data[arms[0]])) \
        else None
    losses_after = (lambda s: s > k and s != mean_at)
    said = after if mean_at is None else f"{after} (step {mean_at}: *_first_interval)"
    checks += [
        _series("loss_before_stop", "loss", data, arms, p.loss, lambda s: s <= k,
                f"steps up to the stop at step {k} (one configuration)"),
        _series("loss", "loss", data, arms, p.loss, losses_after, said),
        _series("aux_loss", "aux_loss", data, arms, aux, losses_after, said),
        _series("grad_norm", "grad_norm", data, arms, grad, lambda s: s > k, after),
        _lr_check(p, data, arms, k, after),
        _memory_after_load(p, data, arms, k),
    ]
    if mean_at is not None:
        checks += [check_first_interval(f"{key}_first_interval", key, data, arms, mean_at)
                   for key in ("loss", "aux_loss")]
    return tuple(checks)


AFTER_LOAD = "allocated_after_load_pct"


def _lr_check(p: ResumePairParams, data: Mapping[str, Steps], arms: tuple[str, str], k: int,
              after: str) -> Check:
    """``lr`` on every step after the stop; n/a where neither arm recorded a learning rate."""
    if not any(rec.lr is not None for a in arms for _, rec in records_of(data[a])):
        return Check.not_applicable("lr", f"neither {arms[0]} nor {arms[1]} recorded a learning "
                                          "rate")
    return _series("lr", "lr", data, arms, p.lr, lambda s: s > k, after)


def _memory_steps(recs: Sequence[StepRecord], keep: Callable[[int], bool]) -> list[StepRecord]:
    return [r for r in recs if keep(r.step) and r.allocated_bytes is not None]


def _same_iteration(data: Mapping[str, Steps], arms: tuple[str, str], k: int
                    ) -> Optional[tuple[dict[str, Steps], str]]:
    """Where neither rank has memory after the stop in both arms but the resumed run reported
    some (Megatron's log reports memory after a run's first iterations only): the second run's
    i-th report set against the uninterrupted run's i-th (each after the same iteration of its
    own process), the resumed records renumbered to the uninterrupted steps; None where there is
    nothing to pair."""
    resumed, straight = data[arms[0]], data[arms[1]]
    out: dict[str, Steps] = {arms[0]: {}, arms[1]: {}}
    said = []
    for rank in sorted(set(resumed) & set(straight)):
        second = _memory_steps(resumed[rank], lambda s: s > k)
        first = _memory_steps(straight[rank], lambda s: True)
        n = min(len(second), len(first))
        if n == 0:
            continue
        out[arms[0]][rank] = [replace(rec, step=ref.step) for rec, ref in zip(second, first)]
        out[arms[1]][rank] = first[:n]
        said.append(f"rank {rank} steps {[r.step for r in second[:n]]} vs "
                    f"{[r.step for r in first[:n]]}")
    if not said:
        return None
    return out, ("no step after the stop where both arms reported memory, so the second run's "
                 "reports are set against the uninterrupted run's first ones, each after the same "
                 "iteration of its own process (" + "; ".join(said) + ")")


def _memory_after_load(p: ResumePairParams, data: Mapping[str, Steps], arms: tuple[str, str],
                       k: int) -> Check:
    """``allocated_after_load_pct``: allocated bytes at each (rank, step) after the stop both
    arms recorded, resumed minus uninterrupted (``pair_memory.level_check``, one-sided); where
    there is no such step, each report of the second run against the uninterrupted run's report
    after the same iteration of its process (:func:`_same_iteration`)."""
    after = {a: {r: [rec for rec in recs if rec.step > k] for r, recs in data[a].items()}
             for a in arms}
    source = f"compare.{RESUME}.{AFTER_LOAD}"
    if p.allocated_after_load_pct == GROWTH_DEFAULT_PCT:
        source += ", by default golden memory's bound"
    common = any(set(r.step for r in _memory_steps(after[arms[0]].get(rank, []), bool))
                 & set(r.step for r in _memory_steps(after[arms[1]].get(rank, []), bool))
                 for rank in after[arms[0]])
    how = f"after the stop at step {k}"
    paired = None if common else _same_iteration(data, arms, k)
    if paired is not None:
        after, how = paired[0], f"{how}: {paired[1]}"
    check = level_check(AFTER_LOAD, after, arms, "allocated_bytes",
                        (p.allocated_after_load_pct, source), lambda r: f"rank {r}")
    return replace(check, detail=f"{how}: {check.detail}")


class Resume(Comparison):
    name = RESUME
    settings = ResumeContract
    order = 70
    judged = {RESUME: Judged(ResumePairParams, check_resume)}
    emulated_skip = ("not run for emulated ranks: the launcher does not stop and resume an "
                     "emulated rank (run the case without emulate.ranks)")

    def rules(self, case: Case, settings: ResumeContract) -> list[Problem]:
        """(Built-in workload) a stop step inside the run, bitwise only when deterministic, and
        for graph arms a stop after the capture (so the resumed arm captures its graphs again)."""
        t = case.train
        problems: list[Problem] = []
        stop = settings.step(t.steps)
        if not 1 <= stop < t.steps:
            problems.append(Problem(at("compare.resume.at_step"), (
                f"the arm is stopped after step {stop} and must resume before the last of the "
                f"{t.steps} train.steps: use 1 <= at_step < {t.steps} (or more steps)")))
        if case.command is not None:  # the command decides its determinism and its graphs
            return problems
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
        wanted = settings.arm_names(has_graph_arms(case))
        for name in dict.fromkeys(planner.arm(a, field) for a in wanted):
            twin = planner.add(replace(planner.spec_of(name), resumed_at=after))
            params = ResumePairParams(**dict(settings), after=after, log_lines=(
                case.command is not None
                and source_facts(case.command.metrics).averaged_first_interval))
            pairs.append(Pair(pair_name(RESUME, len(pairs), name), RESUME, (twin, name), params))
        return pairs


    def command_not_applicable(self, case: Case, pair: Pair, fields: frozenset[str]
                               ) -> dict[str, str]:
        """A command's resume pair: the checkpoint step the loaded process holds needs
        ``command.resume.iteration_file`` or a source whose records carry it; the first-interval
        checks of Megatron's log need the series they compare; the learning rate, a source
        that has it."""
        assert case.command is not None
        metrics = case.command.metrics
        facts = source_facts(metrics)
        resume = case.command.resume
        why = {f"{name}_first_interval": not_mapped(metrics, name)
               for name in ("aux_loss",) if name not in fields}
        if "lr" not in fields or not facts.reports_lr:
            why["lr"] = not_mapped(metrics, "lr")
        named = resume is not None and resume.iteration_file is not None
        if not named and not facts.carries_checkpoint_step:
            why["loaded_checkpoint"] = (
                f"the case names no command.resume.iteration_file (e.g. Megatron's "
                f"latest_checkpointed_iteration.txt) and its metrics (command.metrics.source "
                f"{metrics.source}) name no checkpoint step (the record API's checkpoint_step=)")
        return why


register(Resume())
