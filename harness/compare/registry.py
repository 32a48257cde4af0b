"""The comparison registry: one object per comparison, owning every part of it.

A comparison is one module of :mod:`harness.compare.contracts` holding a :class:`Comparison`
subclass and registering an instance of it (:func:`register`). The object owns:

* ``name`` and ``settings``: the ``compare.<name>`` section of a case file and its settings model
  (registered into the case schema: ``harness.spec.comparisons``), and ``order``, where its
  section and its pairs sit among the others';
* :meth:`Comparison.rules`: its preflight rules (``harness.spec.preflight`` runs them);
  :meth:`Comparison.command_roles`: the arm roles (``command.arms.<role>``) a command case with
  it must give, or ``not_for_commands``: why a command case cannot have it
  (``harness.spec.comparisons.command_problems``);
* :meth:`Comparison.command_not_applicable`: the checks of its pairs a command case's metrics
  source cannot feed (its command-case rules), with the reason;
* :meth:`Comparison.plan`: the arms and pairs it plans, through a :class:`Planner`
  (``harness.arms.plan_case`` hands it one); :meth:`Comparison.fixed_cp_sizes`: CP sizes its
  fixed-CP arms add to the arms a case can have;
* ``judged``: contract name -> :class:`Judged` (the typed settings of its pairs, the check
  function, whether its checks are figures of the summary, which of its checks come from the
  CUDA-graph capture statistics); most comparisons judge one contract, named after them,
  ``slot_ring`` two;
* ``summary``: a section of ``summary.md`` of its own (:class:`SummarySection`), if any;
* ``emulated_skip`` / ``emulated_not_comparable``: what an emulated case does not judge of it;
  ``emulated_figures``: which figures of the emulated-rank table its pair's two arms give
  (``harness.report.emulated``).

``harness.compare`` imports every module of that package, so a new comparison is one new file
and its tests. A check function gets the pair (``pair.params`` an instance of its ``params``
model) and arm -> rank -> step records of the pair's arms, and returns the contract's checks;
the arm and sanity checks are added by :mod:`harness.compare.evaluate`. It raises
:class:`ContractSkipped` when the contract does not apply to this run, and ValueError, KeyError
or TypeError when it cannot be evaluated (an ``error`` entry naming the reason).
"""

from __future__ import annotations

import abc

from dataclasses import dataclass
from types import MappingProxyType
from typing import (TYPE_CHECKING, Any, Callable, ClassVar, Literal, Mapping, Optional, Protocol,
                    Sequence)

from pydantic import BaseModel

from harness.errors import CaseError
from harness.spec.comparisons import CommandRole, CompareSection, add_section
from harness.spec.derive import ArmSpec
from harness.spec.names import ARM_CHECKS_CONTRACT
from harness.spec.problems import Problem
from harness.spec.schema import ArmCase, Case

from .series import Steps
from .verdicts import Check

if TYPE_CHECKING:
    from .pair import Pair

ContractFn = Callable[["Pair", Mapping[str, Steps]], tuple[Check, ...]]

# Why an emulated case does not judge losses (said in its verdict entries).
EMULATED_LOSSES = ("an emulated rank's loss and grad norm are its own local figures, not the "
                   "model's: its communication is a loopback (harness/workload/loopback.py)")

# Which figures of the emulated-rank table (TE #3353's validation beside ours,
# ``harness.report.emulated``) a comparison's pair gives, from its two arms' records of one rank:
# ``graphed`` (graph arm, eager arm): the capture line, bitwise steps, CP sizes and forward
# replays, graph pool, step time, peak allocated; ``pools`` (slot-shared, separate pools): the
# pool over the largest variant's; ``memory`` (DCP, fixed CP): the memory probes' deltas and the
# allocation-site diff.
EmulatedFigures = Literal["graphed", "pools", "memory"]


@dataclass(frozen=True)
class Judged:
    """How the pairs of one contract are judged: their settings model (``Pair.params``), the
    check function, whether ``summary.md`` lists its checks under its graph and memory figures
    (``figures``), and which of its checks are made from the CUDA-graph capture statistics
    (``StepRecord.graph_stats``, ``capture_checks``) and from the memory probe
    (``StepRecord.memory_probe``, ``probe_checks``): a command case whose metrics source does
    not carry them marks those not applicable when it is planned (``harness.arms``)."""

    params: type[BaseModel]
    check: ContractFn
    figures: bool = False
    capture_checks: tuple[str, ...] = ()
    probe_checks: tuple[str, ...] = ()


@dataclass(frozen=True)
class SummarySection:
    """A section of ``summary.md`` of a comparison's own: under ``title`` and ``intro``, one line
    per verdict entry of the comparison with a check named ``check`` (its detail)."""

    title: str
    intro: str
    check: str


class Planner(Protocol):
    """What a comparison plans with (``harness.arms`` hands one to :meth:`Comparison.plan`)."""

    @property
    def pairs(self) -> Sequence["Pair"]:
        """The pairs planned so far (the comparisons before this one, in order)."""

    def arm(self, name: str, field: str) -> str:
        """The canonical name of the arm a case file calls ``name`` (derived once and
        preflighted); a CaseError at ``field`` when the case cannot have it."""

    def add(self, spec: ArmSpec) -> str:
        """The name of the arm ``spec`` (one beyond the names a case file may use: a resumed
        twin, an arm at a microbatch count), derived once and preflighted."""

    def spec_of(self, name: str) -> ArmSpec:
        """What the planned arm ``name`` runs."""

    def case_of(self, name: str) -> ArmCase:
        """The case the planned arm ``name`` runs."""


class Comparison(abc.ABC):
    """One comparison: its settings, rules, plan, checks and figures (see the module docstring).
    A subclass sets the class attributes and overrides :meth:`plan` (and :meth:`rules`,
    :meth:`fixed_cp_sizes` where it has any)."""

    name: ClassVar[str]
    settings: ClassVar[type[BaseModel]]
    order: ClassVar[int]
    judged: ClassVar[Mapping[str, Judged]]
    summary: ClassVar[Optional[SummarySection]] = None
    # An emulated case skips its pairs, with this reason (None: they are judged, rank by rank).
    emulated_skip: ClassVar[Optional[str]] = None
    # Checks an emulated case does not judge (not applicable), and why.
    emulated_not_comparable: ClassVar[tuple[tuple[str, ...], str]] = ((), "")
    # The figures of the emulated-rank table its pair gives (None: none).
    emulated_figures: ClassVar[Optional[EmulatedFigures]] = None
    # Why a command case (``command:``) cannot have this comparison (None: it can).
    not_for_commands: ClassVar[Optional[str]] = None

    def rules(self, case: Case, settings: Any) -> list[Problem]:
        """The problems of ``settings`` in ``case`` (a command case too: the rules that need the
        built-in workload check ``case.command``)."""
        return []

    def command_roles(self, case: Case, settings: Any) -> tuple[CommandRole, ...]:
        """The arm roles whose arguments (``command.arms.<role>``) a command case with these
        settings must give: its arms run them, and without them two arms run the same command."""
        return ()

    @abc.abstractmethod
    def plan(self, case: Case, settings: Any, planner: Planner) -> list["Pair"]:
        """The pairs of ``settings`` in ``case``, their arms made through ``planner`` (every
        comparison has one: a subclass without it cannot be registered)."""

    def command_not_applicable(self, case: Case, pair: "Pair", fields: frozenset[str]
                               ) -> dict[str, str]:
        """Check -> why ``pair`` of command case ``case`` cannot judge it, beyond the series,
        capture and probe checks every comparison's command pairs get (``harness.arms``):
        ``fields`` are the step-record fields the case's metrics source can fill; its static
        facts are ``harness.spec.source_facts.source_facts(case.command.metrics)``."""
        return {}

    def fixed_cp_sizes(self, case: Case, settings: Any) -> tuple[int, ...]:
        """CP sizes of fixed-CP arms this comparison adds to the arms ``case`` can have."""
        return ()

    def error(self, case: Case, field: str, message: str) -> CaseError:
        """A CaseError at ``field`` of ``case`` (a pair the case cannot have)."""
        return CaseError(message, file=case.source, case=case.id, field=field)


_comparisons: dict[str, Comparison] = {}
_judged: dict[str, Judged] = {}
_owner: dict[str, str] = {}  # contract -> the comparison that judges it
_checks: dict[str, ContractFn] = {}
_params: dict[str, type[BaseModel]] = {}

# Read-only views, filled as the comparison modules are imported (``harness.compare.contracts``):
# comparison name -> its object; contract -> how it is judged, its check function, its pairs'
# settings model.
COMPARISONS: Mapping[str, Comparison] = MappingProxyType(_comparisons)
JUDGED: Mapping[str, Judged] = MappingProxyType(_judged)
CONTRACTS: Mapping[str, ContractFn] = MappingProxyType(_checks)
PAIR_PARAMS: Mapping[str, type[BaseModel]] = MappingProxyType(_params)


def register(comparison: Comparison) -> Comparison:
    """Register ``comparison``: its section of the case schema, its contracts. A name another
    class registered is a ValueError naming both; the same class again replaces itself."""
    taken = {comparison.name: _comparisons.get(comparison.name)}
    taken.update({c: _comparisons.get(_owner.get(c, "")) for c in comparison.judged})
    for name, old in taken.items():
        if name == ARM_CHECKS_CONTRACT:
            raise ValueError(f"'{ARM_CHECKS_CONTRACT}' is the arm-checks entry, not a contract name")
        if old is not None and _qualname(old) != _qualname(comparison):
            raise ValueError(f"contract '{name}' is registered twice: {_qualname(old)} and "
                             f"{_qualname(comparison)}")
    _comparisons[comparison.name] = comparison
    for contract, judged in comparison.judged.items():
        _judged[contract], _owner[contract] = judged, comparison.name
        _checks[contract], _params[contract] = judged.check, judged.params
    add_section(CompareSection(comparison.name, comparison.settings, comparison.order,
                               comparison.rules, comparison.command_roles,
                               comparison.not_for_commands))
    return comparison


def comparisons() -> tuple[Comparison, ...]:
    """Every registered comparison, in order (the order of the plan's pairs)."""
    return tuple(sorted(_comparisons.values(), key=lambda c: (c.order, c.name)))


def comparison_of(contract: str) -> Optional[Comparison]:
    """The comparison that judges ``contract`` (None: not a registered contract)."""
    owner = _owner.get(contract)
    return _comparisons[owner] if owner is not None else None


def _qualname(comparison: Comparison) -> str:
    return f"{type(comparison).__module__}.{type(comparison).__qualname__}"


class ContractSkipped(Exception):
    """A contract that does not apply to this run: its entry is ``skipped`` with the reason, or
    an error with that reason when the case requires the contract (``required``). ``kind`` is
    the skip kind the gate counts and a CI accepts by name (``verdicts.SKIP_KINDS``)."""

    required: bool = False
    kind: str = "not-applicable"

    def reason(self, sweep_dir: Optional[str]) -> str:
        """The reason, naming ``sweep_dir`` in the commands it gives (None: a placeholder)."""
        return str(self)
