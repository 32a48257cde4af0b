"""CPU tests of the ordered warmup: the event sequence (pure) and its execution on CPU modules."""

from __future__ import annotations

import weakref
from typing import Any

import pytest
import torch

from harness.slotmem.plan import plan_pipeline
from harness.slotmem.planerrors import ScheduleError
from harness.slotmem.protocol import build_slot_map
from harness.slotmem.schedule import order_events, rank_order
from harness.slotmem.warmup import WarmupError, WarmupStep, ordered_warmup, warmup_steps

from tests.slotmem.oracles import held_frames


@pytest.fixture(scope="module")
def pp2_plan() -> Any:
    return plan_pipeline(2, 2, (4, 6, 8), (1, 2, 4), [[2, 1], [2, 1]]).ranks[0]


def _units(steps: tuple[WarmupStep, ...]) -> list[tuple[int, bool, int, int, int]]:
    """(iteration, forward, chunk, microbatch, layer) of each lockstep unit, in order."""
    out: list[tuple[int, bool, int, int, int]] = []
    for s in steps:
        unit = (s.iteration, s.forward, s.chunk, s.microbatch, s.layer)
        if not out or out[-1] != unit:
            out.append(unit)
    return out


def test_steps_replay_the_order_one_variant_at_a_time(pp2_plan) -> None:
    smap = build_slot_map(pp2_plan.records, pp2_plan.layers_per_chunk)
    layers = pp2_plan.layers_per_chunk
    steps = warmup_steps(pp2_plan.order, layers, smap.variants, 2, smap.warmup_group)
    evs = order_events(pp2_plan.order, len(layers))
    expected = [
        (it, ev.forward, ev.chunk, ev.microbatch, l)
        for it in range(2)
        for ev in evs
        for l in (range(layers[ev.chunk]) if ev.forward else reversed(range(layers[ev.chunk])))
    ]
    n = len(expected)
    assert len(steps) == n * 3
    for k, cp in enumerate((4, 2, 1)):  # each variant replays the whole order, largest CP first (warmup group)
        block = steps[k * n:(k + 1) * n]
        assert {s.cp_size for s in block} == {cp}
        assert _units(block) == expected  # forwards and backwards interleaved as in the order
    # without groups the variants keep the given order
    plain = warmup_steps(pp2_plan.order, layers, (2, 1), 1)
    assert plain[0].cp_size == 2 and plain[-1].cp_size == 1


def test_each_forward_is_held_until_its_backward_and_then_released(pp2_plan) -> None:
    layers = pp2_plan.layers_per_chunk
    variants = (1, 2, 4)
    steps = warmup_steps(pp2_plan.order, layers, variants, 2)
    held = held_frames(steps)
    # expected: frames of the microbatches in flight after each order event, times layers and variants
    in_flight: dict[tuple[int, int], int] = {}
    peak_by_order = 0
    for ev in order_events(pp2_plan.order, len(layers)):
        if ev.forward:
            in_flight[(ev.chunk, ev.microbatch)] = layers[ev.chunk]
        else:
            del in_flight[(ev.chunk, ev.microbatch)]
        peak_by_order = max(peak_by_order, sum(in_flight.values()))
    assert max(held) == peak_by_order  # one variant in flight at a time, never the sum over variants
    assert held[-1] == 0
    total = sum(layers[ev.chunk] for ev in order_events(pp2_plan.order, len(layers))) // 2 * len(variants)
    assert max(held) < total, "a warmup that never releases would hold every forward"
    seen: set[tuple[int, int, int, int, int]] = set()
    for s, before, after in zip(steps, (0, *held), held):
        key = (s.iteration, *s.frame)
        if s.forward:
            assert after == before + 1 and key not in seen
            seen.add(key)
        else:
            assert key in seen and after == before - 1  # its own forward came first; released now


def test_bad_arguments_fail_closed() -> None:
    with pytest.raises(WarmupError, match=">= 1"):
        warmup_steps((1, -1), (1,), (1,), 0)
    with pytest.raises(WarmupError, match="distinct"):
        warmup_steps((1, -1), (1,), (2, 2), 1)
    with pytest.raises(ScheduleError):
        warmup_steps((1, 1, -1), (1,), (1,), 1)  # does not drain


class _Probe(torch.nn.Module):
    """CPU layer recording every call; keeps only weak references to its outputs."""

    def __init__(self, hidden: int, log: list[tuple[int, int]], key: tuple[int, int]) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(hidden, hidden)
        self.log, self.key = log, key
        self.outs: list[weakref.ref[torch.Tensor]] = []
        self.switch_after: int | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(self.key)
        y = torch.tanh(self.fc(x))
        if self.switch_after is not None and len(self.outs) >= self.switch_after:
            y = y * torch.sigmoid(x)  # saves more tensors than before
        self.outs.append(weakref.ref(y))
        return y


def _cpu_model(layers: tuple[int, ...], log: list[tuple[int, int]]) -> dict[tuple[int, int], _Probe]:
    torch.manual_seed(0)
    return {(c, l): _Probe(8, log, (c, l)) for c, n in enumerate(layers) for l in range(n)}


def _sample(cp: int, chunk: int, layer: int) -> tuple[torch.Tensor, ...]:
    return (torch.randn(16 // cp, 8, requires_grad=True),)


def test_ordered_warmup_runs_the_steps_and_frees_outputs_at_their_backward() -> None:
    layers = (2, 1)
    order = rank_order(2, 0, 4, 2, 2)
    steps = warmup_steps(order, layers, (1, 2), 2)
    calls: list[tuple[int, int]] = []
    modules = _cpu_model(layers, calls)
    hooks: list[int] = []
    held_seen: list[int] = []
    out_refs: dict[tuple[int, int, int, int, int], weakref.ref[torch.Tensor]] = {}

    def on_step(step: WarmupStep, held: int) -> None:
        held_seen.append(held)
        key = (step.iteration, *step.frame)
        if step.forward:
            out_refs[key] = modules[(step.chunk, step.layer)].outs[-1]
            assert out_refs[key]() is not None
        else:
            assert out_refs[key]() is None, f"{step}: output still alive after its backward"

    plans = ordered_warmup(modules, _sample, steps, hooks.append, require_cuda=False, on_step=on_step)
    assert calls == [(s.chunk, s.layer) for s in steps if s.forward]
    assert hooks == [s.cp_size for s in steps]
    assert tuple(held_seen) == held_frames(steps)
    assert set(plans) == {(v, c, l) for v in (1, 2) for (c, l) in modules}
    p = plans[(2, 0, 1)]
    assert p.inputs[0].shape == (8, 8) and p.input_grads == (True,) and all(p.params_used)
    assert all(m.fc.weight.grad is None for m in modules.values())  # warmup never touches .grad


def test_ordered_warmup_rejects_a_callable_that_saves_differently_later() -> None:
    layers = (1,)
    calls: list[tuple[int, int]] = []
    modules = _cpu_model(layers, calls)
    modules[(0, 0)].switch_after = 2  # from its 3rd forward on (microbatch 2) it saves more
    steps = warmup_steps((1, 1, -1, 1, -1, -1), layers, (1,), 2)
    with pytest.raises(WarmupError, match="iteration 0 microbatch 2 saved/returned different tensors than iteration 0 microbatch 0"):
        ordered_warmup(modules, _sample, steps, require_cuda=False)


def test_ordered_warmup_requires_cuda_outputs_by_default() -> None:
    modules = _cpu_model((1,), [])
    with pytest.raises(WarmupError, match="CUDA"):
        ordered_warmup(modules, _sample, warmup_steps((1, -1), (1,), (1,), 1))
