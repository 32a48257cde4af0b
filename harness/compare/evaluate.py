"""Evaluation: a case's pairs and their arms' step records -> one verdict.

Every arm of a pair gets the arm checks and the sanity checks (``arm_checks``); the pair's
contract (``registry.CONTRACTS``) adds its own. The status rule (``pair_status``) and how
statuses combine are in ``verdicts``' docstring.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Mapping, Optional, Sequence, Union

from harness.results import ArmOutcome
from harness.spec.names import ARM_CHECKS_CONTRACT, ARM_CHECKS_PAIR
from harness.spec.schema import SanitySpec

from .arm_checks import COMPLETENESS, OneWriter, RankSet, arm_checks, ranks_agree, sanity_checks
from .memory_model import memory_model_check
from .packing import PackingRules, packing_check
from .pair import Pair
from .registry import CONTRACTS, PAIR_PARAMS, ContractSkipped
from .series import Steps
from .verdicts import SWEEP_MARK, CaseVerdict, Check, PairStatus, PairVerdict, combine_status

ArmData = Mapping[str, tuple[Optional[ArmOutcome], Steps]]  # arm -> (outcome, rank -> records)


def _arm_error(arm: str, outcome: Optional[ArmOutcome], present: bool) -> Optional[str]:
    if not present:
        return f"arm '{arm}' has no results"
    if outcome is None:
        return f"arm '{arm}' has no outcome (it never finished; re-run the sweep to resume it)"
    if not outcome.ok:
        return f"arm '{arm}' {outcome.describe()}"
    return None


def _status(checks: Sequence[Check], errors: Sequence[str]) -> PairStatus:
    # Evidence of a regression: a failed check on recorded values. Missing data (the
    # completeness check, a comparison without common steps: value None) is not evidence.
    evidence = [c for c in checks if not c.passed and c.value is not None
                and not c.name.endswith("." + COMPLETENESS)]
    if evidence:
        return "fail"
    if errors:
        return "error"
    return "pass" if all(c.passed for c in checks) else "fail"


pair_status = _status  # the rule, public: the report re-derives stored statuses with it


def _name_sweep(check: Check, sweep_dir: Optional[str]) -> Check:
    """``check`` with the sweep folder put where its detail names it (``SWEEP_MARK``)."""
    if sweep_dir is None or SWEEP_MARK not in check.detail:
        return check
    return replace(check, detail=check.detail.replace(SWEEP_MARK, sweep_dir))


# One count (ranks 0..n-1) or the ranks themselves, for every arm, or arm -> either.
ExpectedRanks = Union[None, RankSet, Mapping[str, RankSet]]


def _ranks_of(expected_ranks: ExpectedRanks, arm: str) -> Optional[RankSet]:
    if isinstance(expected_ranks, Mapping):
        return expected_ranks.get(arm)
    return expected_ranks


def _arms_skipped(pair: Pair, arm_data: ArmData) -> Optional[str]:
    """The reasons of the pair's arms that were not run here (outcome ``skipped``), or None."""
    skipped = [arm_data[a][0] for a in pair.arms
               if a in arm_data and arm_data[a][0] is not None and arm_data[a][0].status == "skipped"]
    if not skipped:
        return None
    return "; ".join(dict.fromkeys(o.detail for o in skipped if o is not None))  # once each


def _not_applicable(checks: Sequence[Check], why: Mapping[str, str]) -> list[Check]:
    """``checks`` with those the plan marked not applicable recorded as such, with the reason."""
    return [Check.not_applicable(c.name, why[c.name], c.bound) if c.name in why else c
            for c in checks]


@dataclass(frozen=True)
class Expected:
    """What a case expects of its arms, for every pair it judges (:func:`evaluate_case`'s
    keywords): ``steps`` and ``ranks`` (one count or rank list for every arm, or arm -> count;
    an arm not named: the largest rank seen) make the completeness check exact; ``sanity``
    (None: every sanity check on); ``sweep_dir``, named in the commands of skipped entries;
    ``packing``: arm -> its :class:`PackingRule` (``CasePlan.packing_rules``), each arm named
    there also gets ``<arm>.packing``; ``memory_bound``: the case's bound on the predicted vs
    measured memory (:func:`evaluate_case`)."""

    steps: Optional[int] = None
    ranks: ExpectedRanks = None
    sanity: Optional[SanitySpec] = None
    sweep_dir: Optional[str] = None
    packing: PackingRules = None
    memory_bound: Optional[float] = None
    # arm -> its writer when one series stands for every rank (``arm_checks(shared=...)``:
    # judged once, on the writer's records); an arm not named: each rank wrote its own
    shared: Optional[Mapping[str, OneWriter]] = None


def _no_rank_values(pair: Pair, writer: Optional[OneWriter]) -> Optional[str]:
    """Why an arm's ranks have no values of their own to compare (``ranks_agree`` n/a), or None."""
    if pair.emulated is not None:
        return "emulated ranks record their own local figures, not the world's"
    if writer is not None:
        return (f"one series for every rank, written by {writer.writer} (rank {writer.rank}): no "
                "rank's own values to compare (a source with per-rank values has them)")
    return None


def evaluate_pair(case_id: str, pair: Pair, arm_data: ArmData,
                  expected: Expected = Expected(),
                  arms_judged: Optional[dict[tuple, tuple[Check, ...]]] = None) -> PairVerdict:
    """Arm checks and sanity checks of the pair's arms + the contract's checks -> one
    PairVerdict, by what the case ``expected``. A pair with an arm that was not run here, or
    whose contract does not apply (:class:`ContractSkipped`, e.g. no golden values for this
    platform), is ``skipped`` with the reason and no checks. ``arms_judged``: the arms' own
    checks made for the case's other pairs (filled here), so an arm of several pairs is
    checked once."""
    arms_judged = {} if arms_judged is None else arms_judged
    expected_steps, expected_ranks = expected.steps, expected.ranks
    sweep_dir, packing, memory_bound = expected.sweep_dir, expected.packing, expected.memory_bound
    sanity = expected.sanity if expected.sanity is not None else SanitySpec()
    checks: list[Check] = []
    errors: list[str] = []
    if pair.skipped is not None:  # decided when the plan was made: emulated ranks
        return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), (), "skipped",
                           pair.skipped, skip="emulated")
    why = _arms_skipped(pair, arm_data)
    if why is not None:  # the launcher (or submit) could not give an arm the GPUs it needs
        return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), (), "skipped", why,
                           skip="needs-gpu")
    for arm in pair.arms:
        outcome, steps = arm_data.get(arm, (None, {}))
        err = _arm_error(arm, outcome, arm in arm_data)
        if err:
            errors.append(err)
        writer = (expected.shared or {}).get(arm)
        rank_name = pair.rank_name if pair.emulated is not None else None
        no_values = _no_rank_values(pair, writer)
        key = (arm, rank_name, writer, no_values)
        if key not in arms_judged:  # an arm of several pairs: its own checks made once
            own = list(arm_checks(arm, steps, expected_steps, _ranks_of(expected_ranks, arm),
                                  rank_name, writer))
            own.append(ranks_agree(arm, steps, no_values))
            if packing is not None and arm in packing:
                own.append(packing_check(arm, steps, packing[arm]))
            own.extend(memory_model_check(arm, steps, memory_bound, rank_name))
            own.extend(sanity_checks(arm, steps, sanity, writer))
            arms_judged[key] = tuple(own)
        checks.extend(arms_judged[key])
    if pair.contract != ARM_CHECKS_CONTRACT:
        fn = CONTRACTS.get(pair.contract)
        if fn is None:
            errors.append(f"unknown contract '{pair.contract}' (known: {', '.join(sorted(CONTRACTS))})")
        elif not isinstance(pair.params, PAIR_PARAMS[pair.contract]):
            errors.append(f"pair '{pair.name}' has no typed {pair.contract} settings")
        elif all(arm in arm_data for arm in pair.arms):
            try:
                checks.extend(_name_sweep(c, sweep_dir)
                              for c in fn(pair, {a: arm_data[a][1] for a in pair.arms}))
            except ContractSkipped as skip:
                if skip.required:
                    errors.append(skip.reason(sweep_dir))
                else:
                    return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), (),
                                       "skipped", skip.reason(sweep_dir), skip=skip.kind)
            except (ValueError, KeyError, TypeError) as exc:
                said = str(exc) if sweep_dir is None else str(exc).replace(SWEEP_MARK, sweep_dir)
                errors.append(f"contract '{pair.contract}' could not be evaluated: {said}")
    checks = _not_applicable(checks, pair.not_applicable_checks)
    return PairVerdict(case_id, pair.name, pair.contract, tuple(pair.arms), tuple(checks),
                       _status(checks, errors), "; ".join(errors) or None)


def evaluate_case(
    case_id: str,
    pairs: Sequence[Pair],
    arm_data: ArmData,
    *,
    expected_steps: Optional[int] = None,
    expected_ranks: ExpectedRanks = None,
    sanity: Optional[SanitySpec] = None,
    sweep_dir: Optional[str] = None,
    packing: PackingRules = None,
    memory_bound: Optional[float] = None,
    shared: Optional[Mapping[str, OneWriter]] = None,
) -> CaseVerdict:
    """Evaluate every pair of a case. ``arm_data``: arm name -> (outcome or None, rank -> step
    records). ``expected_steps`` (``case.train.steps``) and ``expected_ranks`` (arm -> the ranks
    that record, ``PlannedArm.ranks``, or one count for all) make the completeness check exact;
    without them the largest step and rank seen are expected. ``sanity``: ``case.compare.sanity``
    (None: every sanity check on). ``sweep_dir``: named in the commands of skipped entries. Arms in
    no judged pair (or a case with no pairs) get one extra entry named ``checks`` with their arm
    checks (an arm whose only pair's contract was skipped keeps its arm checks there).
    ``packing``: arm -> its packing rule (``CasePlan.packing_rules``), the ``<arm>.packing``
    check of every entry the arm is in. ``shared``: arm -> where its records come from when one
    series stands for every rank (``Expected.shared``)."""
    expected = Expected(expected_steps, expected_ranks, sanity, sweep_dir, packing, memory_bound,
                        shared)
    arms_judged: dict[tuple, tuple[Check, ...]] = {}
    verdicts = [evaluate_pair(case_id, p, arm_data, expected, arms_judged) for p in pairs]
    in_pairs = {a for p, v in zip(pairs, verdicts) for a in p.arms
                if v.status != "skipped" or _arms_skipped(p, arm_data) is not None}
    loose = tuple(a for a in sorted(arm_data) if a not in in_pairs)
    if loose or not pairs:
        extra = Pair(ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, loose)
        if not loose:
            verdicts.append(PairVerdict(case_id, ARM_CHECKS_PAIR, ARM_CHECKS_CONTRACT, (), (), "error",
                                        "the case has no arms with results"))
        else:
            verdicts.append(evaluate_pair(case_id, extra, arm_data, expected, arms_judged))
    return CaseVerdict(case_id, tuple(verdicts), combine_status([v.status for v in verdicts]))
