"""Reference Qwen3-MoE-shaped workload and its parallel runtime (PP/VPP, CP, dynamic CP, EP, DP).

Public entry points (docs/internals.md): :class:`RankContext`, :func:`init_distributed`,
:func:`train_arm` (which trains an arm case: ``harness.arms`` derives it).
"""

from harness.workload.runtime import RankContext, init_distributed
from harness.workload.train import train_arm

__all__ = ["RankContext", "init_distributed", "train_arm"]
