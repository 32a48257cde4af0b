"""Layout rules shared by preflight, packing and the runtime (each rule written once).

Pure functions of integers: each returns ``None`` when the layout holds, else why it does not.
"""

from __future__ import annotations

from typing import Optional


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def cp_divides_problem(size: int, dp_cp: int) -> Optional[str]:
    """A CP size must divide the DP x CP ranks of a pipeline stage: its CP groups are the aligned,
    contiguous blocks of that pool (the rule for a fixed CP size)."""
    if size < 1 or dp_cp % size:
        return f"CP size {size} does not divide the {dp_cp} DP x CP ranks of a pipeline stage"
    return None


def cp_size_problem(size: int, dp_cp: int) -> Optional[str]:
    """A dynamic-CP size (or the fixed CP a DCP case is compared with) must also be a power of two
    (Megatron's dynamic CP groups)."""
    if not is_pow2(size) or cp_divides_problem(size, dp_cp) is not None:
        return (f"CP size {size} must be a power of two dividing the {dp_cp} DP x CP ranks of a "
                "pipeline stage")
    return None
