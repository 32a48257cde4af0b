"""The names of arms and contracts, written once: every module of the harness uses these
constants (case files and verdicts spell the same strings).

An *arm kind* is what an arm runs (``harness.arms.plan_case`` derives it;
``harness.caseplan.PlannedArm.kind``); an arm's name is its kind, ``fixed-cp<N>`` /
``graph-fixed-cp<N>`` with its CP size, ``graph-mb<M>`` with a microbatch count, and the
suffixes ``-repeat`` (the second run of a ``repeat`` pair) and ``-resumed`` (the arm stopped and
resumed by ``compare.resume``). A *contract* is what a pair must satisfy
(``harness.compare.registry``); a pair is named after its contract, ``<contract>-<arm>`` for the
second and later pairs of ``reference`` and ``resume``, ``slot_ring-plan`` for the planner's
figures, and ``checks`` for the entry of the arm checks of arms in no pair.
"""

from __future__ import annotations

from typing import Final, Literal

# ------------------------------------------------------------------ arm kinds
EAGER: Final = "eager"  # the case eagerly (named ``dcp`` in a dynamic-CP case)
DCP: Final = "dcp"  # the eager arm of a dynamic-CP case
FIXED_CP: Final = "fixed-cp"  # the case at one fixed CP size (``fixed-cp<N>``)
GRAPH: Final = "graph"  # slot-shared CUDA graphs, one MemPool
SEPARATE_POOLS: Final = "graph-separate-pools"  # CUDA graphs, one pool per CP size
GRAPH_FIXED_CP: Final = "graph-fixed-cp"  # CUDA graphs at one fixed CP size
REFERENCE: Final = "reference"  # the case on one rank, eager, dynamic shapes
ARM_KINDS: Final = (EAGER, DCP, FIXED_CP, GRAPH, SEPARATE_POOLS, GRAPH_FIXED_CP, REFERENCE)
# The same names as a type (tests/spec/test_names.py checks that the two agree).
ArmKind = Literal["eager", "dcp", "fixed-cp", "graph", "graph-separate-pools", "graph-fixed-cp",
                  "reference"]
FIXED_CP_KINDS: Final = (FIXED_CP, GRAPH_FIXED_CP)  # the kinds that run at one CP size N
REPEAT_SUFFIX: Final = "-repeat"
RESUMED_SUFFIX: Final = "-resumed"
MICROBATCHES_INFIX: Final = "-mb"
# The argument role of a command case's repeat arm (``command.arms.repeat``).
REPEAT_ROLE: Final = "repeat"

# ------------------------------------------------------------------ contracts
REPEAT: Final = "repeat"
GRAPH_VS_EAGER: Final = "graph_vs_eager"
DCP_VS_FIXED_CP: Final = "dcp_vs_fixed_cp"
GRAPH_POOLS: Final = "graph_pools"
REFERENCE_CONTRACT: Final = "reference"  # the single-rank arm and its contract share the name
GOLDEN: Final = "golden"
ORACLE: Final = "oracle"  # the oracle arm and its contract share the name
RESUME: Final = "resume"
SLOT_RING: Final = "slot_ring"
SLOT_RING_PLAN: Final = "slot_ring_plan"
# The entry of arms in no pair: arm checks only, no settings (not a registered contract).
ARM_CHECKS_CONTRACT: Final = "arm_checks"

# ------------------------------------------------------------------ pair names beyond a contract's
SLOT_RING_PLAN_PAIR: Final = "slot_ring-plan"  # the ``slot_ring_plan`` pair
ARM_CHECKS_PAIR: Final = "checks"  # verdict entry holding arm checks of arms in no pair


def pair_name(contract: str, index: int, arm: str) -> str:
    """The name of a contract's ``index``-th pair (0-based) of several, one per ``arm``
    (``reference``, ``resume``): the contract's name, then ``<contract>-<arm>``."""
    return contract if index == 0 else f"{contract}-{arm}"
