"""A pair: arms plus the contract that compares them, with the contract's typed settings, and
the form ``plan.json`` keeps it in (:class:`StoredPair`, read through pydantic)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Any, Mapping, Optional

from pydantic import BaseModel, ConfigDict, ValidationError

from harness.results.records import Int, Str
from harness.results.typed import OmitEmpty, OmitNone
from harness.spec.places import short_label

from .registry import PAIR_PARAMS


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

    def two_arms(self) -> tuple[str, str]:
        """(candidate, reference); a ValueError naming the pair when it has not two arms."""
        if len(self.arms) != 2:
            raise ValueError(f"pair '{self.name}' ({self.contract}) needs exactly 2 arms, "
                             f"got {list(self.arms)}")
        return self.arms[0], self.arms[1]


@dataclass(frozen=True)
class StoredPair:
    """A pair as ``plan.json`` keeps it, written (:meth:`of`) and read through this type: its
    settings a JSON object, validated into the contract's model by :meth:`pair`; an unknown key
    is an error naming it. ``skipped``, ``not_applicable`` and ``emulated`` are left out while
    unset (plans written before them)."""

    __pydantic_config__ = ConfigDict(extra="forbid")

    name: Str
    contract: Str
    arms: tuple[Str, ...]
    params: dict[Str, Any] = field(default_factory=dict)
    skipped: Annotated[Optional[Str], OmitNone] = None
    not_applicable: Annotated[dict[Str, Str], OmitEmpty] = field(default_factory=dict)
    emulated: Annotated[Optional[Int], OmitNone] = None

    @classmethod
    def of(cls, pair: Pair) -> "StoredPair":
        """``pair`` as stored: its typed settings as their model dumps them to JSON."""
        params = (pair.params.model_dump(mode="json") if isinstance(pair.params, BaseModel)
                  else dict(pair.params or {}))
        return cls(pair.name, pair.contract, pair.arms, params, skipped=pair.skipped,
                   not_applicable=pair.not_applicable_checks, emulated=pair.emulated)

    def pair(self) -> Pair:
        """The pair; a ValueError naming a bad setting of its contract."""
        return Pair(self.name, self.contract, self.arms, self.params, skipped=self.skipped,
                    not_applicable=self.not_applicable, emulated=self.emulated)
