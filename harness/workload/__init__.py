"""Reference Qwen3-MoE-shaped workload and its parallel runtime (PP/VPP, CP, dynamic CP, EP, DP).

Public entry points (docs/internals.md): :class:`TrainOptions`, :class:`RankContext`,
:func:`init_distributed`, :func:`train_arm`.
"""

from harness.workload.options import TrainOptions
from harness.workload.runtime import RankContext, init_distributed
from harness.workload.train import train_arm

__all__ = ["TrainOptions", "RankContext", "init_distributed", "train_arm"]
