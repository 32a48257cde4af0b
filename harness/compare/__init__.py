"""Pairs, contracts and checks: turn arms' step records into a verdict.

A *pair* is two arms plus a *contract*: ``arms = (candidate, reference)``; relative differences
and memory deltas are measured against the reference arm (the ``golden`` contract has one arm and
compares it with committed values). Every arm also gets the *arm checks* (all steps present on
every rank, no NaN/Inf loss or grad norm, no skipped step) and the *sanity checks* of
``compare.sanity`` (grad norm not zero, loss moves, no loss spike).

Modules, one job each (this package is a leaf: no torch, no launch, no workload):

* ``verdicts``: ``Check``, ``PairVerdict``, ``CaseVerdict``, ``verdict.json`` (``write_verdict``,
  ``read_verdict``), ``combine_status`` and the status rules;
* ``series``: per-step series of an arm's records (``step_series``, ``field_of``), the figures
  they carry (``graph_stats``, ``frame_replays``) and the tolerance rule two series are compared
  under (``compare_series``);
* ``arm_checks``: the checks every arm gets (``arm_checks``, ``sanity_checks``);
* ``packing``: what an arm packed against what its case asks for (``PackingRule``,
  ``packing_rule``, ``packing_check``: ``<arm>.packing``);
* ``pair``: ``Pair`` (arms, contract, the contract's typed settings), ``StoredPair`` (as
  ``plan.json`` keeps it);
* ``registry``: one ``Comparison`` object per comparison, owning its ``compare.<name>`` settings,
  preflight rules, planned arms and pairs, checks and figures (``register``, ``comparisons``,
  ``COMPARISONS``; per contract ``JUDGED``, ``CONTRACTS``, ``PAIR_PARAMS``), ``ContractSkipped``;
* ``contracts/``: one module per comparison (``repeat``, ``graph_vs_eager``, ``dcp_vs_fixed_cp``,
  ``graph_pools``, ``reference``, ``golden``, ``resume``, ``slot_ring``), each registering
  itself; a new comparison is one new module there;
* ``golden_perf``: the golden contract's two-sided step-time and memory checks;
* ``ring``: the slot ring's fill rule (``compare.slot_ring``);
* ``evaluate``: ``evaluate_pair``, ``evaluate_case``, ``Expected`` (what a case expects of its
  arms), ``pair_status``.

Every name other code uses is importable from ``harness.compare`` itself.
"""

from __future__ import annotations

from harness.spec.names import ARM_CHECKS_CONTRACT, ARM_CHECKS_PAIR

from . import contracts
from .arm_checks import (COMPLETENESS, LOSS_SANITY_CHECKS, OneWriter, RankSet, arm_checks,
                         sanity_checks)
from .contracts.golden import GoldenMissing, GoldenPairParams, judged_file, recorded_differences
from .contracts.graph_vs_eager import bitwise_figure
from .contracts.reference import ReferencePairParams, StaticBins, regroup_step
from .contracts.resume import ResumePairParams
from .contracts.slot_ring import SlotRingPairParams, SlotRingPlanParams
from .evaluate import ArmData, Expected, ExpectedRanks, evaluate_case, evaluate_pair, pair_status
from .packing import PackingRule, PackingRules, describe_packing, packing_check, packing_rule
from .pair import Pair, StoredPair
from .registry import (
    COMPARISONS,
    CONTRACTS,
    EMULATED_LOSSES,
    JUDGED,
    PAIR_PARAMS,
    Comparison,
    ContractFn,
    ContractSkipped,
    EmulatedFigures,
    Judged,
    Planner,
    SummarySection,
    comparison_of,
    comparisons,
    register,
)
from .series import (
    MIB,
    Record,
    Steps,
    compare_series,
    field_of,
    first_rank_records,
    frame_replays,
    frames_text,
    step_series,
)
from .verdicts import (
    DEFAULT_ALLOWED_SKIPS,
    SKIP_KINDS,
    SWEEP_MARK,
    PAIR_STATUSES,
    CaseVerdict,
    Check,
    PairStatus,
    PairVerdict,
    SkipKind,
    combine_status,
    read_verdict,
    write_verdict,
)

__all__ = [
    "ARM_CHECKS_CONTRACT", "ARM_CHECKS_PAIR", "ArmData", "DEFAULT_ALLOWED_SKIPS", "SKIP_KINDS", "COMPLETENESS", "CONTRACTS", "CaseVerdict",
    "COMPARISONS", "Comparison", "EMULATED_LOSSES", "EmulatedFigures", "JUDGED", "Judged", "Planner", "SummarySection",
    "comparison_of", "comparisons", "register",
    "Check", "ContractFn", "ContractSkipped", "Expected", "ExpectedRanks", "GoldenMissing", "GoldenPairParams",
    "judged_file", "recorded_differences",
    "LOSS_SANITY_CHECKS", "MIB", "PAIR_PARAMS", "PAIR_STATUSES", "PackingRule", "PairStatus", "SkipKind", "PackingRules",
    "Pair", "PairVerdict", "RankSet", "Record", "ReferencePairParams", "ResumePairParams",
    "SWEEP_MARK", "SlotRingPairParams", "StoredPair", "SlotRingPlanParams", "StaticBins", "Steps",
    "OneWriter", "arm_checks", "bitwise_figure", "combine_status", "compare_series", "contracts", "describe_packing",
    "evaluate_case", "evaluate_pair", "field_of", "first_rank_records", "frame_replays",
    "frames_text", "packing_check",
    "packing_rule", "pair_status", "read_verdict", "regroup_step", "sanity_checks", "step_series",
    "write_verdict",
]
