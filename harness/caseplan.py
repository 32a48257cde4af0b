"""The plan of a case: its arms and pairs, computed once and kept in the sweep.

``harness.arms.plan_case`` turns a loaded case into a :class:`CasePlan`: every arm (the derived
case it runs, its world size, the ranks that run and record, and its kind) and every pair (with
its typed contract settings, ``harness.compare.Pair``), everything a verdict needs resolved when
the plan is made (golden values copied, paths absolute). :func:`write_plan` stores it beside
``case.json`` as ``plan.json``, with a content hash of the case; the local sweep, the Slurm job,
``status``, ``collect``, retries, ``gate``, ``report`` and ``golden record`` read it back with
:func:`read_plan`, and none of them derives arms again. It is read through pydantic
(:class:`StoredPlan`): an unknown, mistyped or missing field is an error naming it. A leaf: no
torch, no launch, no arms.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Mapping, Optional

from pydantic import ConfigDict, PlainSerializer, ValidationError

from harness.compare import PackingRule, Pair, StoredPair, packing_rule
from harness.results.typed import keys_in_order, read_typed
from harness.errors import ConfigError
from harness.results import (
    CASE_FILE,
    ManifestArm,
    ManifestCase,
    PathLike,
    ResultsError,
    read_json,
    write_json_record,
)
from harness.results.records import Bool, Int, Str
from harness.spec.names import ARM_KINDS, ArmKind
from harness.spec.places import emulated_labels, emulated_title
from harness.spec.schema import ArmCase, Case, SanitySpec

PLAN_FILE = "plan.json"
# 2: arms say whether they are emulated (``emulated``: each rank's label), pairs may be skipped or
# have checks marked not applicable when the plan is made. 3: an arm's case is an ``ArmCase``
# (its ``arm`` and ``execution``, no ``compare`` section).
PLAN_VERSION = 3
# case.json fields that do not change what runs (the path the case file was given by).
UNHASHED_FIELDS = ("source",)
_FORBID = ConfigDict(extra="forbid")  # an unknown key in plan.json is an error naming it


class PlanError(ResultsError):
    """A stored plan is missing, unreadable, or does not belong to the stored case."""


def case_hash(case_json: Mapping[str, Any]) -> str:
    """sha256 of a case as stored in ``case.json`` (canonical JSON, ``source`` left out)."""
    data = {k: v for k, v in case_json.items() if k not in UNHASHED_FIELDS}
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class PlannedArm:
    """One arm of a case. ``case`` is the arm's case it runs (its layout and execution),
    ``world_size`` the ranks of that layout, ``ranks`` the ranks that run here and record steps
    (every rank of the layout, or the emulated ones: :attr:`emulated`), ``kind`` one of
    :data:`ARM_KINDS` and ``repeat`` whether it is the second run of a ``repeat`` pair. ``name``
    is its results folder."""

    name: str
    kind: ArmKind
    case: ArmCase
    world_size: int
    ranks: tuple[int, ...]
    repeat: bool = False

    def __post_init__(self) -> None:
        if self.kind not in ARM_KINDS:
            raise ValueError(f"arm '{self.name}': kind must be one of {ARM_KINDS}, got {self.kind!r}")
        ranks = tuple(self.ranks)
        object.__setattr__(self, "ranks", ranks)
        if not ranks or list(ranks) != sorted(set(ranks)) or not all(
                0 <= r < self.world_size for r in ranks):
            raise ValueError(f"arm '{self.name}': ranks {list(ranks)} must be distinct, ascending "
                             f"ranks of its world of {self.world_size}")
        if self.emulated and ranks != self.case.emulated_ranks:
            raise ValueError(f"arm '{self.name}': ranks {list(ranks)} are not the emulated ranks "
                             f"{list(self.case.emulated_ranks)} of its case")

    @property
    def graphed(self) -> bool:
        return self.case.execution.graphed

    @property
    def emulated(self) -> bool:
        """Each of :attr:`ranks` runs alone on one device as rank r of :attr:`world_size`, its
        communication stood in for by the loopback layer (the case's ``emulate``)."""
        return self.case.emulate is not None

    @property
    def labels(self) -> tuple[str, ...]:
        """``emulated rank r of N (PP stage s of P, pool rank p)`` per rank (empty: real ranks)."""
        return emulated_labels(self.case, self.ranks) if self.emulated else ()


def _case_json(case: ArmCase) -> dict[str, Any]:
    return case.model_dump(mode="json")


@dataclass(frozen=True)
class StoredArm:
    """An arm as ``plan.json`` keeps it, written (:meth:`of`) and read through this type:
    ``emulated`` the labels of its emulated ranks (None: real ranks), which must be what its case
    emulates; its derived case last, as pydantic dumps it to JSON."""

    __pydantic_config__ = _FORBID

    name: Str
    kind: ArmKind
    world_size: Int
    ranks: tuple[Int, ...]
    case: Annotated[ArmCase, PlainSerializer(_case_json)]
    repeat: Bool = False
    emulated: Optional[tuple[Str, ...]] = None

    _keys = keys_in_order("name", "kind", "world_size", "ranks", "repeat", "emulated", "case")

    @classmethod
    def of(cls, arm: PlannedArm) -> "StoredArm":
        return cls(name=arm.name, kind=arm.kind, world_size=arm.world_size, ranks=arm.ranks,
                   case=arm.case, repeat=arm.repeat,
                   emulated=arm.labels if arm.emulated else None)

    def arm(self) -> PlannedArm:
        """The planned arm; a ValueError naming it when its fields do not agree."""
        arm = PlannedArm(name=self.name, kind=self.kind, case=self.case,
                         world_size=self.world_size, ranks=self.ranks, repeat=self.repeat)
        if self.emulated != (arm.labels if arm.emulated else None):
            said = list(self.emulated) if self.emulated is not None else None
            raise ValueError(f"arm '{arm.name}': 'emulated' {said!r} is not what its case "
                             f"emulates ({list(arm.labels) or None})")
        return arm


@dataclass(frozen=True)
class CasePlan:
    """A case, its arms (each once, in run order) and its pairs (in verdict order)."""

    case: Case
    case_hash: str
    source: str  # absolute path of the case file when the plan was made
    arms: tuple[PlannedArm, ...]
    pairs: tuple[Pair, ...]

    def __post_init__(self) -> None:
        names = [a.name for a in self.arms]
        if len(set(names)) != len(names):
            raise ValueError(f"case '{self.case.id}': arms named twice in {names}")
        # A pair skipped when the plan was made (e.g. the reference of an emulated case) names
        # arms that never run.
        unknown = sorted({a for p in self.pairs if p.skipped is None for a in p.arms} - set(names))
        if unknown:
            raise ValueError(f"case '{self.case.id}': pairs name arms {unknown} the plan lacks")
        mixed = [a.name for a in self.arms if a.emulated != self.emulated]
        if mixed:
            raise ValueError(f"case '{self.case.id}': arms {mixed} are "
                             f"{'not ' if self.emulated else ''}emulated, the case is"
                             f"{'' if self.emulated else ' not'}")

    @property
    def case_id(self) -> str:
        return self.case.id

    @property
    def steps(self) -> int:
        return self.case.train.steps

    @property
    def sanity(self) -> Optional[SanitySpec]:
        return self.case.compare.sanity

    @property
    def arm_names(self) -> tuple[str, ...]:
        return tuple(a.name for a in self.arms)

    @property
    def expected_ranks(self) -> dict[str, tuple[int, ...]]:
        """Arm -> the ranks that must record every step (the completeness check)."""
        return {a.name: a.ranks for a in self.arms}

    @property
    def packing_rules(self) -> dict[str, PackingRule]:
        """Arm -> what its case asks its packer for (the ``<arm>.packing`` check)."""
        return {a.name: packing_rule(a.case) for a in self.arms}

    @property
    def largest_arm(self) -> PlannedArm:
        """The arm with the most ranks per node (then nodes): what a machine must host."""
        return max(self.arms, key=lambda a: (a.case.resources.gpus_per_node * a.case.resources.nodes,
                                             a.case.resources.gpus_per_node))

    @property
    def needs_cuda(self) -> bool:
        return any(a.case.needs_cuda for a in self.arms)

    @property
    def emulated(self) -> bool:
        """The case's arms run emulated ranks (``emulate``), each alone on one device."""
        return self.case.emulate is not None

    @property
    def labels(self) -> tuple[str, ...]:
        """The emulated ranks' labels (``emulated rank r of N ...``); empty for a real run."""
        return emulated_labels(self.case, self.case.emulated_ranks) if self.emulated else ()

    @property
    def title(self) -> str:
        """How a line names the case: its id, with ``(emulated rank r of N, ...)`` when emulated."""
        return emulated_title(self.case_id, self.case.emulated_ranks, self.case.layout.world)

    def arm(self, name: str) -> PlannedArm:
        """The arm ``name``; a ConfigError naming the case's arms otherwise."""
        for arm in self.arms:
            if arm.name == name:
                return arm
        raise ConfigError(f"case '{self.case_id}' has no arm '{name}' (its arms: "
                          f"{', '.join(self.arm_names)})")

    def manifest_entry(self) -> ManifestCase:
        """What the sweep's manifest lists of this case: its id, hash, arms with ranks, pairs."""
        return ManifestCase(id=self.case_id, case_hash=self.case_hash,
                            arms=tuple(ManifestArm(name=a.name, ranks=a.ranks) for a in self.arms),
                            pairs=tuple(p.name for p in self.pairs))


@dataclass(frozen=True)
class StoredPlan:
    """``plan.json``, written (:meth:`of`) and read through this type: a plan without its case,
    which is ``case.json`` (``case_hash`` ties the two; :meth:`plan` joins them again)."""

    __pydantic_config__ = _FORBID

    version: Int
    case_id: Str
    case_hash: Str
    source: Str
    arms: tuple[StoredArm, ...]
    pairs: tuple[StoredPair, ...]

    @classmethod
    def of(cls, plan: CasePlan) -> "StoredPlan":
        return cls(version=PLAN_VERSION, case_id=plan.case_id, case_hash=plan.case_hash,
                   source=plan.source, arms=tuple(StoredArm.of(a) for a in plan.arms),
                   pairs=tuple(StoredPair.of(p) for p in plan.pairs))

    def plan(self, case: Case) -> CasePlan:
        """The plan of ``case``; a ValueError for fields that do not agree."""
        return CasePlan(case=case, case_hash=self.case_hash, source=self.source,
                        arms=tuple(a.arm() for a in self.arms),
                        pairs=tuple(p.pair() for p in self.pairs))


def write_plan(case_dir: PathLike, plan: CasePlan) -> Path:
    return write_json_record(Path(case_dir) / PLAN_FILE, StoredPlan.of(plan))


def plan_from_files(case_json: Any, plan_json: Any, where: PathLike) -> CasePlan:
    """The plan stored as ``plan_json`` for the case stored as ``case_json`` (both parsed JSON
    of the folder ``where``); PlanError saying what does not fit."""
    folder = Path(where)
    if not isinstance(case_json, Mapping) or not isinstance(plan_json, Mapping):
        raise PlanError(f"{folder}: {CASE_FILE} and {PLAN_FILE} must be JSON objects")
    if plan_json.get("version") != PLAN_VERSION:
        raise PlanError(f"{folder / PLAN_FILE}: plan version {plan_json.get('version')!r}, this "
                        f"dcp-harness reads {PLAN_VERSION}; re-run the sweep with the same --out")
    stored, actual = plan_json.get("case_hash"), case_hash(case_json)
    if stored != actual:
        raise PlanError(f"{folder / CASE_FILE} is not the case this sweep ran: its content hash "
                        f"{actual[:12]} differs from {str(stored)[:12]} in {PLAN_FILE} (the stored "
                        "case was edited after the run); re-run the case")
    try:
        case = Case.model_validate(dict(case_json))
        stored: StoredPlan = read_typed(StoredPlan, plan_json, PLAN_FILE, nonfinite=False)
        return stored.plan(case)
    except ResultsError as exc:
        raise PlanError(f"{folder / PLAN_FILE}: {exc}") from None
    except (ValidationError, ValueError) as exc:
        first = exc.errors()[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
        raise PlanError(f"{folder}: {PLAN_FILE} cannot be read back ({type(exc).__name__}: "
                        f"{first})") from None


def read_plan(case_dir: PathLike) -> CasePlan:
    """The plan stored in a case folder (``case.json`` + ``plan.json``); PlanError when either
    is missing or unreadable, or when they do not belong together."""
    folder = Path(case_dir)
    if not (folder / CASE_FILE).is_file():
        raise PlanError(f"{folder} has no {CASE_FILE}: not a case folder of a sweep")
    if not (folder / PLAN_FILE).is_file():
        raise PlanError(f"{folder} has no {PLAN_FILE} (written by an older dcp-harness, or "
                        "removed); re-run the sweep with the same --out to plan it again")
    return plan_from_files(read_json(folder / CASE_FILE), read_json(folder / PLAN_FILE), folder)
