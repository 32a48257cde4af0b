"""Trust nothing a verdict.json says that the step records do not prove.

The gate and every report use the verdict :func:`judge_case` derives: the case's pairs are
evaluated again from the arms' outcomes and step records (``harness.compare.evaluate_case``, the
same rule that wrote ``verdict.json``) and compared with the stored verdict, check by check.

* an unreadable step or outcome file, or a case whose rules cannot be read, is an ``error``;
* a stored verdict that disagrees with the records (a status that its checks do not support, a
  check value the records do not give, steps the records do not hold) is an ``error`` naming the
  difference, or a ``fail`` when the records themselves show a regression;
* otherwise the re-evaluated verdict, equal to the stored one, stands.

Which arms and pairs a case has comes from its stored plan (``plan.json``, written when the
sweep ran, tied to ``case.json`` by a content hash: :func:`rules_from_plan`). The caller's rule
(:data:`RulesFn`) may check more; the CLI passes the harness's own
(``harness.launch.rules.case_rules``: the plan must be there, match what the harness plans for
the stored case, and the case file, where it is readable, must still define that case). Without
a plan, :func:`rules_from_files` takes the pairs named in ``verdict.json`` with their settings from
``case.json`` (hand-made folders). A leaf: no torch, no launch, no arms.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

from harness.compare import (
    ARM_CHECKS_PAIR,
    CaseVerdict,
    Check,
    Pair,
    PairVerdict,
    combine_status,
    ExpectedRanks,
    PackingRules,
    evaluate_case,
    pair_status,
)
from harness.caseplan import CasePlan
from harness.results import ArmOutcome, ResultsError, StepRecord
from harness.spec.limits import LIMITS, STEPS

Steps = Mapping[int, Sequence[StepRecord]]  # rank -> that rank's step records


@dataclass(frozen=True)
class CaseRules:
    """What a case must have run: its arms, its pairs, and how many steps and ranks each arm
    records (None: the largest seen)."""

    arms: tuple[str, ...]
    pairs: tuple[Pair, ...]
    expected_steps: Optional[int]
    expected_ranks: ExpectedRanks  # one count, or arm -> its ranks (a reference arm records on one)
    sanity: Any = None  # the case's compare.sanity (None: every sanity check on)
    packing: PackingRules = None  # arm -> its packing rule (None: no packing check)


@dataclass(frozen=True)
class StoredCase:
    """What a case folder holds that its rules are read from: ``case.json`` (a dict), the stored
    verdict and the stored plan (each None when there is none)."""

    case: Mapping[str, Any]
    verdict: Optional[CaseVerdict]
    plan: Optional[CasePlan]


# A stored case -> its rules. Raising makes the case an error naming the reason.
RulesFn = Callable[[StoredCase], CaseRules]


def rules_from_plan(plan: CasePlan) -> CaseRules:
    """The arms, pairs, steps, ranks and sanity settings of a stored plan."""
    return CaseRules(plan.arm_names, plan.pairs, plan.steps, plan.expected_ranks, plan.sanity,
                     plan.packing_rules)


def stored_rules(stored: StoredCase) -> CaseRules:
    """The default: the stored plan's rules, or :func:`rules_from_files` without a plan."""
    if stored.plan is not None:
        return rules_from_plan(stored.plan)
    return rules_from_files(stored.case, stored.verdict)


def _bounded(data: Mapping[str, Any], section: str, key: str) -> Optional[int]:
    """``data[section][key]`` when an int (None otherwise); ValueError past its schema bound
    (a corrupt case.json must not make the checks build a range of 10**23 steps)."""
    value = (data.get(section) or {}).get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        return None
    bound = LIMITS[f"{section}.{key}"]
    if not 1 <= value <= bound.max:
        raise ValueError(f"{section}.{key} is {value}, outside 1..{bound.max}")
    return value


def rules_from_files(case: Mapping[str, Any], stored: Optional[CaseVerdict]) -> CaseRules:
    """The pairs ``verdict.json`` names, with their settings from ``case.json``'s ``compare:``
    section; steps from ``train.steps``, ranks from ``resources`` (nodes x gpus_per_node)."""
    compare = case.get("compare") or {}
    pairs: list[Pair] = []
    arms: list[str] = []
    for p in stored.pairs if stored is not None else ():
        arms += [a for a in p.arms if a not in arms]
        if p.contract != "arm_checks":
            pairs.append(Pair(p.pair, p.contract, p.arms, dict(compare.get(p.contract) or {})))
    nodes, per_node = _bounded(case, "resources", "nodes"), _bounded(case, "resources", "gpus_per_node")
    return CaseRules(tuple(arms), tuple(pairs), _bounded(case, "train", "steps"),
                     nodes * per_node if nodes is not None and per_node is not None else None)


# --------------------------------------------------------------------------- comparison
def _same_number(a: Optional[float], b: Optional[float]) -> bool:
    if a is None or b is None:
        return a is b
    return a == b or (math.isnan(a) and math.isnan(b))


def _check_difference(stored: Check, derived: Check) -> Optional[str]:
    if stored.passed != derived.passed or stored.applicable != derived.applicable:
        said = "passed" if stored.passed else "failed"
        shows = "passes" if derived.passed else "fails"
        return f"check {stored.name} says {said}, the records say it {shows} ({derived.detail})"
    if (not _same_number(stored.value, derived.value) or not _same_number(stored.bound, derived.bound)
            or not _same_number(stored.lower, derived.lower)):
        return (f"check {stored.name} says value {stored.value!r} (bound {stored.bound!r}, lower "
                f"{stored.lower!r}), the records give {derived.value!r} (bound {derived.bound!r}, "
                f"lower {derived.lower!r})")
    return None


def pair_differences(stored: PairVerdict, derived: PairVerdict) -> list[str]:
    """How a stored verdict entry differs from the one the records give (empty: it agrees)."""
    out: list[str] = []
    if tuple(stored.arms) != tuple(derived.arms) or stored.contract != derived.contract:
        out.append(f"it compares {stored.contract} {list(stored.arms)}, the case defines "
                   f"{derived.contract} {list(derived.arms)}")
    kept = {c.name: c for c in stored.checks}
    made = {c.name: c for c in derived.checks}
    for name in made:
        if name not in kept:
            out.append(f"check {name} is missing")
    for name, check in kept.items():
        if name not in made:
            out.append(f"check {name} is not one the records give")
        else:
            diff = _check_difference(check, made[name])
            if diff:
                out.append(diff)
    # A skipped entry has no checks (an arm could not run here); whether it was skipped is what
    # the re-judged entry (from the arms' outcomes) says, compared above by status.
    own = ("skipped" if stored.status == "skipped" and not stored.checks
           else pair_status(stored.checks, [stored.error] if stored.error else []))
    if stored.status != own:
        out.append(f"status '{stored.status}' but its own checks give '{own}'")
    elif stored.status != derived.status and not out:
        out.append(f"status '{stored.status}', the records give '{derived.status}'")
    return out


def _disagreeing(derived: PairVerdict, problems: Sequence[str]) -> PairVerdict:
    """``derived`` marked as an error (a fail when its checks show a regression)."""
    message = "verdict.json disagrees with the step records: " + "; ".join(problems) + (
        " (re-run the sweep with the same --out to re-judge it)")
    errors = [message] + ([derived.error] if derived.error else [])
    return PairVerdict(derived.case_id, derived.pair, derived.contract, derived.arms,
                       derived.checks, pair_status(derived.checks, errors), "; ".join(errors))


def error_verdict(case_id: str, arms: Sequence[str], message: str) -> CaseVerdict:
    """A case verdict of one ``error`` entry (nothing could be judged)."""
    entry = PairVerdict(case_id, ARM_CHECKS_PAIR, "arm_checks", tuple(arms), (), "error", message)
    return CaseVerdict(case_id, (entry,), "error")


def reconcile(stored: CaseVerdict, derived: CaseVerdict) -> CaseVerdict:
    """The derived verdict, with every entry the stored one misstates marked (see module doc)."""
    kept = {p.pair: p for p in stored.pairs}
    pairs: list[PairVerdict] = []
    for p in derived.pairs:
        old = kept.pop(p.pair, None)
        problems = ["the entry is missing"] if old is None else pair_differences(old, p)
        pairs.append(_disagreeing(p, problems) if problems else p)
    for name in kept:  # entries the case does not define
        pairs.append(PairVerdict(stored.case_id, name, kept[name].contract, kept[name].arms, (),
                                 "error", f"verdict.json has an entry '{name}' that the case does "
                                          "not define; re-run the sweep with the same --out"))
    status = combine_status([p.status for p in pairs])
    if stored.status != status and status == "pass":  # every entry agrees, the case status not
        pairs.append(PairVerdict(stored.case_id, ARM_CHECKS_PAIR, "arm_checks", (), (), "error",
                                 f"verdict.json says '{stored.status}' but its entries and the "
                                 "step records say 'pass'"))
        status = "error"
    return CaseVerdict(derived.case_id, tuple(pairs), status)


# --------------------------------------------------------------------------- judging
@dataclass(frozen=True)
class ArmFiles:
    """What one arm's folder holds (``problem``: a file that could not be read)."""

    outcome: Optional[ArmOutcome]
    steps: Steps
    problem: Optional[str] = None


def _step_problem(steps: Steps, last: int) -> Optional[str]:
    """A record whose ``step`` is not a step of the case (1..``last``), or None."""
    for rank in sorted(steps):
        for rec in steps[rank]:
            step = rec.step
            if not 1 <= step <= last:
                return (f"rank {rank} holds a record of step {step!r}, not a step of this case "
                        f"(1..{last})")
    return None


def judge_case(case_id: str, case: Optional[Mapping[str, Any]], stored: Optional[CaseVerdict],
               arms: Mapping[str, ArmFiles], rules: RulesFn = stored_rules,
               problems: Sequence[str] = (), plan: Optional[CasePlan] = None,
               sweep_dir: Optional[str] = None) -> CaseVerdict:
    """The verdict the gate uses for one case (see module doc). ``problems``: files of the case
    itself that could not be read (case.json, verdict.json, plan.json); ``plan``: the stored
    plan; ``sweep_dir``: named in the commands of skipped entries."""
    if problems:
        return error_verdict(case_id, sorted(arms), "; ".join(problems))
    if stored is None:
        return error_verdict(case_id, sorted(arms), NOT_FINISHED)
    if case is None:
        return error_verdict(case_id, sorted(arms), "no case.json: the case's rules are unknown, so "
                                                    "its verdict cannot be checked against its records")
    try:
        r = rules(StoredCase(case, stored, plan))
    except ResultsError as exc:  # a plan that does not belong to the case: the reason as it is
        return error_verdict(case_id, sorted(arms), str(exc))
    except Exception as exc:  # a case.json the harness cannot read back: never a pass
        return error_verdict(case_id, sorted(arms), f"case.json cannot be read back "
                                                    f"({type(exc).__name__}: {exc})")
    last = r.expected_steps or STEPS.max
    unreadable = [f"arm '{a}': {arms[a].problem or _step_problem(arms[a].steps, last)}"
                  for a in r.arms if a in arms
                  and (arms[a].problem or _step_problem(arms[a].steps, last))]
    if unreadable:
        return error_verdict(case_id, r.arms, "unreadable results, so nothing can be judged: "
                             + "; ".join(unreadable))
    data = {a: (arms[a].outcome, arms[a].steps) for a in r.arms if a in arms}
    derived = evaluate_case(case_id, r.pairs, data, expected_steps=r.expected_steps,
                            expected_ranks=r.expected_ranks, sanity=r.sanity, sweep_dir=sweep_dir,
                            packing=r.packing)
    return reconcile(stored, derived)


NOT_FINISHED = (
    "no verdict.json: the case never finished (interrupted or still running); "
    "re-run the sweep with the same --out to resume it"
)
