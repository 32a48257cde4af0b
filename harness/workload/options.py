"""Options of one training arm (set by ``harness.arms``, never by case files)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

# Test-only faults understood by ``train_arm``:
#   "broken_backward": every parameter gradient is replaced by seeded noise of the same norm
#   before the optimizer step, so training gets no learning signal (the loss must stop falling).
FAULTS = ("broken_backward",)


@dataclass(frozen=True)
class TrainOptions:
    graphs: bool = False  # slot-shared CUDA graphs (GPU issue; eager when False)
    fixed_cp: Optional[int] = None  # run a dynamic-CP case's data with this fixed CP size instead
    fault: Optional[str] = None  # test-only fault injection (see FAULTS)

    def __post_init__(self) -> None:
        if self.fault is not None and self.fault not in FAULTS:
            raise ValueError(f"unknown fault {self.fault!r}; known faults: {', '.join(FAULTS)}")
        if self.fixed_cp is not None and self.fixed_cp < 1:
            raise ValueError(f"fixed_cp must be >= 1, got {self.fixed_cp}")
