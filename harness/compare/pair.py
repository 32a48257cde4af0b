"""A pair: arms plus the contract that compares them, with the contract's typed settings, and
the form ``plan.json`` keeps it in (:class:`StoredPair`, read through pydantic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.results.records import Int, Str
from harness.spec.places import short_label

from .registry import PAIR_PARAMS
from harness.results.typed import read_typed


@dataclass(frozen=True)
class Pair:
    """Two (or, for arm-only entries, more) arms and the contract comparing them.

    ``params``: the contract's typed settings, an instance of ``PAIR_PARAMS[contract]`` (the case
    file's ``compare.<contract>`` model, plus what the planner knows for ``reference`` and
    ``golden``). A mapping is validated into that model here, so a bad setting is a ValueError
    naming the pair when the pair is made (at plan time), never after the run. ``arm_checks`` has
    no settings; an unknown contract keeps what it was given (its entry is an error).

    What the planner decided for this run (``harness.arms``; an emulated case, say): ``skipped``,
    the reason the pair is not judged at all (its entry is ``skipped`` with it, and its arms need
    not have run); ``not_applicable``, check name -> the reason that check does not apply (it is
    recorded as not applicable with that reason); ``emulated``, the world size ``N`` of emulated
    ranks: each rank's records are its own, so series are compared rank by rank and ranks are
    named ``emulated rank r of N`` (None: real ranks, whose losses are global)."""

    name: str
    contract: str
    arms: tuple[str, ...]
    params: Any = None
    skipped: Optional[str] = None
    # (check name, reason) pairs, sorted; a mapping given is turned into them
    not_applicable: tuple[tuple[str, str], ...] = ()
    emulated: Optional[int] = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))
        object.__setattr__(self, "not_applicable",  # frozen and hashable
                           tuple(sorted(dict(self.not_applicable or ()).items())))
        model = PAIR_PARAMS.get(self.contract)
        if model is None or isinstance(self.params, model):
            return
        if self.params is not None and not isinstance(self.params, Mapping):
            raise TypeError(f"pair '{self.name}': {self.contract} settings must be a "
                            f"{model.__name__} or a mapping, got {type(self.params).__name__}")
        try:
            typed = model.model_validate(dict(self.params or {}))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(x) for x in first.get("loc", ())) or "(settings)"
            raise ValueError(f"pair '{self.name}': bad {self.contract} settings: {where}: "
                             f"{first.get('msg')}") from None
        object.__setattr__(self, "params", typed)

    @property
    def not_applicable_checks(self) -> dict[str, str]:
        """Check name -> why it does not apply (decided when the plan was made)."""
        return dict(self.not_applicable)

    def rank_name(self, rank: int) -> str:
        """How a check's detail names ``rank``: ``r3``, or ``emulated rank 3 of N``."""
        return f"r{rank}" if self.emulated is None else short_label(rank, self.emulated)

    # Hand-written: its typed settings as their model dumps them; ``skipped``, ``not_applicable``
    # and ``emulated`` left out while unset (``StoredPair`` reads it back).
    def to_dict(self) -> dict[str, Any]:
        params = (self.params.model_dump(mode="json") if isinstance(self.params, BaseModel)
                  else dict(self.params or {}))
        out = {"name": self.name, "contract": self.contract, "arms": list(self.arms),
               "params": params}
        if self.skipped is not None:
            out["skipped"] = self.skipped
        if self.not_applicable:
            out["not_applicable"] = self.not_applicable_checks
        if self.emulated is not None:
            out["emulated"] = self.emulated
        return out

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Pair":
        """The pair :meth:`to_dict` wrote; a ResultsError naming each unknown, mistyped or
        missing field, a ValueError naming a bad setting of its contract."""
        stored: StoredPair = read_typed(StoredPair, data, "pair", nonfinite=False)
        return stored.pair()

    def two_arms(self) -> tuple[str, str]:
        """(candidate, reference); a ValueError naming the pair when it has not two arms."""
        if len(self.arms) != 2:
            raise ValueError(f"pair '{self.name}' ({self.contract}) needs exactly 2 arms, "
                             f"got {list(self.arms)}")
        return self.arms[0], self.arms[1]


@dataclass(frozen=True)
class StoredPair:
    """A pair as ``plan.json`` keeps it (:meth:`Pair.to_dict`): its settings a JSON object,
    validated into the contract's model by :meth:`pair`; an unknown key is an error naming it."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: Str
    contract: Str
    arms: tuple[Str, ...]
    params: dict[Str, Any] = field(default_factory=dict)
    skipped: Optional[Str] = None
    not_applicable: dict[Str, Str] = field(default_factory=dict)
    emulated: Optional[Int] = None

    def pair(self) -> Pair:
        return Pair(self.name, self.contract, self.arms, self.params, skipped=self.skipped,
                    not_applicable=self.not_applicable, emulated=self.emulated)
