"""Reference Qwen3-MoE-shaped workload and its parallel runtime (PP/VPP, CP, dynamic CP, EP, DP).

Public entry points (docs/internals.md): :class:`RankContext`, :func:`init_distributed`,
:func:`train_arm` (which trains an arm case: ``harness.arms`` derives it).

The names are loaded on first use (PEP 562): ``import harness.workload`` does not import torch; ``RankContext``, ``init_distributed`` and ``train_arm`` do.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers only; at run time the names load lazily
    from harness.workload.runtime import RankContext, init_distributed
    from harness.workload.train import train_arm

# public name -> module that defines it
_LAZY = {
    "RankContext": "harness.workload.runtime",
    "init_distributed": "harness.workload.runtime",
    "train_arm": "harness.workload.train",
}

__all__ = ["RankContext", "init_distributed", "train_arm"]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
