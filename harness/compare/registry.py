"""The contract registry: contract name -> the typed settings of its pairs and its check function.

A contract is one module of :mod:`harness.compare.contracts` that registers itself::

    @contract(REPEAT, RepeatContract)
    def repeat(pair: Pair, data: Mapping[str, Steps]) -> tuple[Check, ...]:
        ...

``harness.compare`` imports every module of that package, so a new contract is one new file
(its settings model goes into the case schema, ``spec/schema.py``, and the planner, ``arms.py``,
makes its pairs). The function gets the pair (``pair.params`` an instance of the registered
model) and arm -> rank -> step records of the pair's arms, and returns the contract's checks;
the arm and sanity checks are added by :mod:`harness.compare.evaluate`. It raises
:class:`ContractSkipped` when the contract does not apply to this run, and ValueError, KeyError
or TypeError when it cannot be evaluated (an ``error`` entry naming the reason).
"""

from __future__ import annotations

from types import MappingProxyType
from typing import TYPE_CHECKING, Callable, Mapping, Optional

from pydantic import BaseModel

from harness.spec.names import ARM_CHECKS_CONTRACT

from .series import Steps
from .verdicts import Check

if TYPE_CHECKING:
    from .pair import Pair

ContractFn = Callable[["Pair", Mapping[str, Steps]], tuple[Check, ...]]

_checks: dict[str, ContractFn] = {}
_params: dict[str, type[BaseModel]] = {}

# Read-only views, filled as the contract modules are imported (``harness.compare.contracts``).
CONTRACTS: Mapping[str, ContractFn] = MappingProxyType(_checks)
PAIR_PARAMS: Mapping[str, type[BaseModel]] = MappingProxyType(_params)


def contract(name: str, params: type[BaseModel]) -> Callable[[ContractFn], ContractFn]:
    """Register the decorated function as contract ``name``, its pairs' settings a ``params``.
    A name registered by another function is a ValueError naming both modules."""

    def register(fn: ContractFn) -> ContractFn:
        if name == ARM_CHECKS_CONTRACT:
            raise ValueError(f"'{ARM_CHECKS_CONTRACT}' is the arm-checks entry, not a contract name")
        old = _checks.get(name)
        if old is not None and (old.__module__, old.__qualname__) != (fn.__module__, fn.__qualname__):
            raise ValueError(f"contract '{name}' is registered twice: {old.__module__}.{old.__qualname__} "
                             f"and {fn.__module__}.{fn.__qualname__}")
        _checks[name] = fn
        _params[name] = params
        return fn

    return register


class ContractSkipped(Exception):
    """A contract that does not apply to this run: its entry is ``skipped`` with the reason, or
    an error with that reason when the case requires the contract (``required``). ``kind`` is
    the skip kind the gate counts and a CI accepts by name (``verdicts.SKIP_KINDS``)."""

    required: bool = False
    kind: str = "not-applicable"

    def reason(self, sweep_dir: Optional[str]) -> str:
        """The reason, naming ``sweep_dir`` in the commands it gives (None: a placeholder)."""
        return str(self)
