"""A pair: arms plus the contract that compares them, with the contract's typed settings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping

from pydantic import BaseModel, ValidationError

from .registry import PAIR_PARAMS


@dataclass(frozen=True)
class Pair:
    """Two (or, for arm-only entries, more) arms and the contract comparing them.

    ``params``: the contract's typed settings, an instance of ``PAIR_PARAMS[contract]`` (the case
    file's ``compare.<contract>`` model, plus what the planner knows for ``reference`` and
    ``golden``). A mapping is validated into that model here, so a bad setting is a ValueError
    naming the pair when the pair is made (at plan time), never after the run. ``arm_checks`` has
    no settings; an unknown contract keeps what it was given (its entry is an error)."""

    name: str
    contract: str
    arms: tuple[str, ...]
    params: Any = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "arms", tuple(self.arms))
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

    def to_dict(self) -> dict[str, Any]:
        params = (self.params.model_dump(mode="json") if isinstance(self.params, BaseModel)
                  else dict(self.params or {}))
        return {"name": self.name, "contract": self.contract, "arms": list(self.arms),
                "params": params}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Pair":
        return cls(str(data["name"]), str(data["contract"]), tuple(data["arms"]),
                   dict(data.get("params") or {}))

    def two_arms(self) -> tuple[str, str]:
        """(candidate, reference); a ValueError naming the pair when it has not two arms."""
        if len(self.arms) != 2:
            raise ValueError(f"pair '{self.name}' ({self.contract}) needs exactly 2 arms, "
                             f"got {list(self.arms)}")
        return self.arms[0], self.arms[1]
