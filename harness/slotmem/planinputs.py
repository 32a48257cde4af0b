"""Planner inputs, checked: CP sizes (variants), layers per chunk per rank, microbatch counts."""

from __future__ import annotations

from typing import Iterable, Sequence, Union

from harness.slotmem.planerrors import PlanError, ScheduleError
from harness.slotmem.schedule import microbatch_count_problem

LayersSpec = Union[int, Sequence[int], Sequence[Sequence[int]]]


def cp_variants(cp_sizes: Iterable[int]) -> tuple[int, ...]:
    """Validated CP sizes, sorted ascending (index = variant; index 0 = canonical, the smallest)."""
    sizes = list(cp_sizes)
    if not sizes:
        raise PlanError("give at least one CP size")
    for size in sizes:
        if not isinstance(size, int) or isinstance(size, bool) or size < 1 or size & (size - 1):
            raise PlanError(f"CP sizes must be powers of two (1, 2, 4, ...), got {size!r}")
    if len(set(sizes)) != len(sizes):
        raise PlanError(f"CP sizes repeat: {sizes}")
    return tuple(sorted(sizes))


def layers_per_rank(layers: LayersSpec, pp: int, vpp: int) -> tuple[tuple[int, ...], ...]:
    """Layers of every chunk of every rank, from one int (every chunk), one list of ``vpp`` ints
    (the same on every rank) or ``pp`` lists of ``vpp`` ints (uneven stages). Zero-layer chunks
    are allowed; a rank with no layer at all is not."""
    def is_list(x: object) -> bool:
        return isinstance(x, (list, tuple))

    if isinstance(layers, int) and not isinstance(layers, bool):
        table: list[list[int]] = [[layers] * vpp for _ in range(pp)]
    elif is_list(layers) and layers and not any(is_list(x) for x in layers):
        table = [list(layers) for _ in range(pp)]  # type: ignore[arg-type]
    elif is_list(layers) and layers and all(is_list(x) for x in layers):
        table = [list(x) for x in layers]  # type: ignore[union-attr]
        if len(table) != pp:
            raise PlanError(f"layers per chunk: got {len(table)} per-rank lists for PP={pp}")
    else:
        raise PlanError(
            f"layers per chunk: give one int (every chunk), a list of {vpp} ints (every rank) or "
            f"{pp} lists of {vpp} ints (one per PP rank), got {layers!r}"
        )
    for rank, row in enumerate(table):
        if len(row) != vpp:
            raise PlanError(
                f"layers per chunk of rank {rank}: got {len(row)} values {row} for VPP={vpp} "
                f"chunks; give one value per chunk"
            )
        for n in row:
            if not isinstance(n, int) or isinstance(n, bool) or n < 0:
                raise PlanError(f"layers per chunk must be integers >= 0, got {n!r}")
        if sum(row) == 0:
            raise PlanError(f"rank {rank} has no layer in any chunk")
    return tuple(tuple(row) for row in table)


def reachable_counts(
    pp: int, vpp: int, group: int, counts: Iterable[int], strict: bool = True
) -> tuple[int, ...]:
    """Sorted unique counts. With ``strict`` every one must be a count Megatron's schedule
    accepts (else :class:`ScheduleError`); without, any positive count is planned (its order is
    still built by the same rules and must drain)."""
    unique = sorted(set(counts))
    if not unique:
        raise ScheduleError("give at least one microbatch count")
    for m in unique:
        if not isinstance(m, int) or isinstance(m, bool) or m < 1:
            raise ScheduleError(f"microbatch counts must be positive integers, got {m!r}")
        if not strict:
            continue
        problem = microbatch_count_problem(pp, vpp, group, m)
        if problem is not None:
            raise ScheduleError(problem)
    return tuple(unique)
