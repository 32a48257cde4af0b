"""GPU tests of slot-shared capture: mixed-variant replay equals eager bitwise; broken protections
(patched out by the tests) are caught."""

from __future__ import annotations

import random
from dataclasses import replace
from typing import Any, Callable

import pytest
import torch

from harness.slotmem import allocator as alloc
from harness.slotmem import capture as capture_mod
from harness.slotmem import replay as replay_mod
from harness.slotmem.capture import CaptureError, capture_plan, make_graphed_callables
from harness.slotmem.ordinary import make_ordinary_graphed_callables
from harness.slotmem.plan import plan_pipeline
from harness.slotmem.protocol import build_slot_map, live_colours
from harness.slotmem.planerrors import PlanError
from harness.slotmem.schedule import order_events, rank_order

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

TOKENS = 256
HIDDEN = 64


class GluLayer(torch.nn.Module):
    """Residual gated MLP with LayerNorm: saves overlapping views of one storage (the two GLU halves)."""

    def __init__(self, hidden: int, seed: int, retain: bool = False) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.norm = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(2 * hidden, hidden)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
        self.retain = retain
        self.kept: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.fc1(self.norm(x))
        a, b = h.chunk(2, dim=-1)
        y = a * torch.sigmoid(b)
        if self.retain:  # a capture-time intermediate kept alive outside the graph's outputs (a pool block:
            with torch.no_grad():  # neither saved nor an output, so no direct write puts it in an arena)
                self.kept = h * 2
        return x + self.fc2(y)


def make_layers(layers_per_chunk: tuple[int, ...], dtype: torch.dtype, retain: bool = False) -> list[list[GluLayer]]:
    return [
        [GluLayer(HIDDEN, 100 * c + l, retain).cuda().to(dtype) for l in range(n)]
        for c, n in enumerate(layers_per_chunk)
    ]


def sampler(dtype: torch.dtype) -> Callable[[int, int, int], tuple[torch.Tensor, ...]]:
    def sample(cp: int, chunk: int, layer: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(TOKENS // cp, HIDDEN, device="cuda", dtype=dtype).requires_grad_(),)

    return sample


def run_schedule(
    call: Callable[[int, int, torch.Tensor, int, int], torch.Tensor],
    order: tuple[int, ...],
    chunks: int,
    layers: tuple[int, ...],
    cp_of: dict[int, int],
    dtype: torch.dtype,
    after_event: Callable[[int], None] | None = None,
    grads_in_flight: bool = True,
) -> dict[str, torch.Tensor]:
    """Run one PP rank's order; outputs are 'sent' at once, input grads at the end of the next
    backward (the PP send in flight; at once without PP). Returns every output and input grad."""
    results: dict[str, torch.Tensor] = {}
    live: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
    pending: tuple[str, torch.Tensor] | None = None
    for i, ev in enumerate(order_events(order, chunks)):
        c, m = ev.chunk, ev.microbatch
        cp = cp_of[m]
        g = torch.Generator(device="cuda").manual_seed(1000 * c + m)
        if layers[c] == 0:
            continue
        if ev.forward:
            x = (torch.randn(TOKENS // cp, HIDDEN, device="cuda", generator=g) * 0.5).to(dtype).requires_grad_()
            h = x
            for l in range(layers[c]):
                h = call(c, l, h, cp, m)
            results[f"out c{c} m{m}"] = h.detach().clone()
            live[(c, m)] = (x, h)
        else:
            x, h = live.pop((c, m))
            g.manual_seed(7 + 1000 * c + m)
            gy = torch.randn(h.shape, device="cuda", generator=g).to(dtype)
            h.backward(gy)
            if pending is not None:
                results[pending[0]] = pending[1].grad.clone()
            pending = (f"dx c{c} m{m}", x)
            if not grads_in_flight:
                results[pending[0]] = x.grad.clone()
                pending = None
        if after_event is not None:
            after_event(i + 1)
    if pending is not None:
        results[pending[0]] = pending[1].grad.clone()
    return results


def param_grads(model: list[list[GluLayer]]) -> dict[str, torch.Tensor]:
    out = {}
    for c, chunk in enumerate(model):
        for l, layer in enumerate(chunk):
            for n, p in layer.named_parameters():
                assert p.grad is not None
                out[f"grad c{c} l{l} {n}"] = p.grad.clone()
                p.grad = None
    return out


def mismatches(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> list[str]:
    assert a.keys() == b.keys()
    return [k for k in a if not torch.equal(a[k], b[k])]


def compare_mixed(
    model: list[list[GluLayer]],
    graphs: Any,
    pp: int,
    rank: int,
    vpp: int,
    group: int,
    microbatches: int,
    cp_of: dict[int, int],
    dtype: torch.dtype,
    poison_smap: Any = None,
    extra: Callable[[int], tuple[torch.Tensor, ...]] = lambda cp: (),
) -> list[str]:
    order = rank_order(pp, rank, microbatches, vpp, group)
    layers = tuple(len(c) for c in model)

    def eager(c: int, l: int, h: torch.Tensor, cp: int, m: int) -> torch.Tensor:
        return model[c][l](h, *extra(cp))

    def graphed(c: int, l: int, h: torch.Tensor, cp: int, m: int) -> torch.Tensor:
        return graphs.layer(c, l)(h, *extra(cp), cp_size=cp, microbatch=m)

    def poison(upto: int) -> None:
        saved, grad = live_colours(order, poison_smap, upto, pp=pp)
        graphs.poison(saved, grad)
        junk = torch.full((1 << 20,), float("nan"), device="cuda")  # eager traffic in the default pool
        del junk

    ref = run_schedule(eager, order, vpp, layers, cp_of, dtype, None, pp > 1)
    ref.update(param_grads(model))
    got = run_schedule(graphed, order, vpp, layers, cp_of, dtype, poison if poison_smap is not None else None, pp > 1)
    got.update(param_grads(model))
    torch.cuda.synchronize()
    return mismatches(ref, got)


@pytest.fixture(autouse=True)
def _exact_math() -> Any:
    prev = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = prev


CASES = [
    # pp, rank, vpp, layers per chunk, reachable counts, replay count, cp sizes, dtype
    pytest.param(2, 0, 2, (2, 2), (4, 6, 8), 8, (1, 2), torch.float32, id="pp2-vpp2-K2"),
    pytest.param(2, 1, 2, (1, 3), (4, 6, 8), 8, (1, 2, 4), torch.float32, id="pp2-vpp2-rank1-uneven-K3"),
    pytest.param(4, 0, 2, (2, 1), (4, 8, 12, 16), 16, (1, 2, 4), torch.bfloat16, id="pp4-vpp2-K3-bf16"),
    pytest.param(1, 0, 1, (3,), (3, 5), 5, (2, 4), torch.float32, id="pp1-K2"),
    pytest.param(2, 0, 1, (2,), (4, 6), 6, (1, 2), torch.float32, id="pp2-novpp-K2"),
]


@pytest.mark.parametrize("chain,direct", [(True, True), (False, True), (True, False)],
                         ids=["chained", "unchained", "copies"])
@pytest.mark.parametrize("pp,rank,vpp,layers,counts,replay_m,cps,dtype", CASES)
def test_mixed_variant_replay_equals_eager(pp, rank, vpp, layers, counts, replay_m, cps, dtype, chain, direct) -> None:
    plan = plan_pipeline(pp, vpp, counts, cps, [list(layers)] * pp).ranks[rank]
    assert plan.physical_slots < replay_m, "the test must wrap the slot ring"
    model = make_layers(layers, dtype)
    logs: list[str] = []
    graphs = capture_plan(model, sampler(dtype), plan, log=logs.append, chain_layers=chain, direct_writes=direct)
    assert any(f"{len(cps)} dynamic-CP variants over {plan.physical_slots} slot-aliased physical pool slots" in s
               for s in logs), logs
    assert graphs.stats is not None
    if direct:  # every layer's fc1/GLU/fc2 activations and its output are written in place
        assert graphs.stats.direct_writes > graphs.stats.copies, graphs.stats
    else:
        assert graphs.stats.direct_writes == 0
    smap = build_slot_map(plan.records, layers)
    rng = random.Random(hash((pp, rank, vpp, cps)) & 0xFFFF)
    choice = [rng.choice(cps) for _ in range(replay_m)]
    assignments = [choice, choice[::-1], [cps[-1]] * replay_m, [cps[0]] * replay_m]
    for assign in assignments:
        bad = compare_mixed(model, graphs, pp, rank, vpp, plan.group, replay_m, dict(enumerate(assign)), dtype, smap)
        assert bad == [], f"variants {assign}: {bad[:6]}"
    graphs.close()


def test_ordinary_path_equals_eager_in_capture_order() -> None:
    layers = (2, 2)
    model = make_layers(layers, torch.float32)
    order = rank_order(2, 0, 4, 2, 2)
    graphs = make_ordinary_graphed_callables(model, sampler(torch.float32), order, [2])
    bad = compare_mixed(model, graphs, 2, 0, 2, 2, 4, {m: 2 for m in range(4)}, torch.float32)
    assert bad == []
    graphs.close()


def _plan_and_model(retain: bool = False) -> tuple[Any, list[list[GluLayer]]]:
    plan = plan_pipeline(2, 2, (4, 6, 8), (1, 2), 2).ranks[0]
    return plan, make_layers((2, 2), torch.float32, retain)


def test_retained_intermediate_is_detached_and_replay_still_exact() -> None:
    plan, model = _plan_and_model(retain=True)
    logs: list[str] = []
    graphs = capture_plan(model, sampler(torch.float32), plan, log=logs.append)
    assert any("detaching" in s for s in logs)
    kept = model[0][0].kept
    assert kept is not None and not alloc.has_standard_deleter(kept.untyped_storage())
    cp_of = {m: (1, 2)[m % 2] for m in range(8)}
    assert compare_mixed(model, graphs, 2, 0, 2, 2, 8, cp_of, torch.float32) == []
    graphs.close()


def test_rewind_skipping_the_restore_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, model = _plan_and_model(retain=True)
    monkeypatch.setattr(alloc, "restore", lambda cp, stale: None)  # the rewind no longer restores
    with pytest.raises(alloc.PoolStateError, match="live set differs"):
        capture_plan(model, sampler(torch.float32), plan)


def test_rewind_missing_a_stale_owner_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, model = _plan_and_model(retain=True)
    real = capture_mod._owner_candidates
    monkeypatch.setattr(capture_mod, "_owner_candidates", lambda module, outs: real(module, outs)[1:])
    with pytest.raises(alloc.PoolStateError, match="no known stale owner"):
        capture_plan(model, sampler(torch.float32), plan)


def test_two_live_frames_one_colour_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, model = _plan_and_model()
    merged = tuple(replace(r, saved_colour=0) for r in plan.records)
    order = rank_order(2, 0, 8, 2, 2)
    with pytest.raises(PlanError, match="saved colour 0"):
        make_graphed_callables(model, sampler(torch.float32), plan.order, merged, extra_orders=(order,))
    # without the check, live frames overwrite each other's arenas: either a saved-tensor check
    # refuses the capture or the mixed replay shows the corruption, with direct writes and copies
    monkeypatch.setattr(capture_mod, "check_orders", lambda orders, smap, pp: None)
    for direct in (True, False):
        try:
            graphs = make_graphed_callables(model, sampler(torch.float32), plan.order, merged, direct_writes=direct)
        except CaptureError:
            continue
        bad = compare_mixed(model, graphs, 2, 0, 2, 2, 8, {m: (1, 2)[m % 2] for m in range(8)}, torch.float32)
        graphs.close()
        assert bad, f"merging the colours of live frames must corrupt results (direct_writes={direct})"


def test_returned_param_grads_must_be_owned(monkeypatch: pytest.MonkeyPatch) -> None:
    plan, model = _plan_and_model()
    graphs = capture_plan(model, sampler(torch.float32), plan)
    monkeypatch.setattr(replay_mod, "own_grad", lambda g: g.detach())  # return the scratch buffer itself
    bad = compare_mixed(model, graphs, 2, 0, 2, 2, 8, {m: (1, 2)[m % 2] for m in range(8)}, torch.float32)
    assert any(k.startswith("grad ") for k in bad), bad
    graphs.close()


class ScaledLayer(torch.nn.Module):
    """Two inputs: hidden states (with grad) and a per-variant scale (no grad, like RoPE or a mask).
    ``cp`` is host-side state set per variant (as a CP process group would be)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.fc = torch.nn.Linear(HIDDEN, HIDDEN)
        self.cp = 0

    def forward(self, x: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        assert x.shape[0] * self.cp == TOKENS, "the variant hook must set cp before warmup/capture"
        return x + torch.tanh(self.fc(self.norm(x))) * scale / self.cp


def test_multi_input_layers_with_a_non_grad_input() -> None:
    plan = plan_pipeline(2, 1, (4, 6), (1, 2), 2).ranks[0]
    model = [[ScaledLayer(l).cuda() for l in range(2)]]
    scales = {cp: torch.rand(TOKENS // cp, 1, device="cuda") for cp in (1, 2)}

    def sample(cp: int, c: int, l: int) -> tuple[torch.Tensor, ...]:
        return (torch.randn(TOKENS // cp, HIDDEN, device="cuda").requires_grad_(), scales[cp].clone())

    def set_cp(cp: int) -> None:
        for layer in model[0]:
            layer.cp = cp

    seen: list[int] = []
    graphs = capture_plan(model, sample, plan, variant_hook=lambda cp: (seen.append(cp), set_cp(cp)))
    assert set(seen) == {1, 2}
    cp_of = {m: (1, 2)[(m * 7) % 3 % 2] for m in range(6)}
    smap = build_slot_map(plan.records, (2,))

    def extra(cp: int) -> tuple[torch.Tensor, ...]:
        set_cp(cp)  # eager needs the state at run time; replay ignores it
        return (scales[cp],)

    assert compare_mixed(model, graphs, 2, 0, 1, 2, 6, cp_of, torch.float32, smap, extra) == []
    graphs.close()


def test_fused_main_grad_accumulates_in_graph_and_hooks_fire() -> None:
    plan = plan_pipeline(2, 2, (4, 6, 8), (1, 2), 2).ranks[0]
    model = make_layers((2, 2), torch.float32)
    params = [p for chunk in model for layer in chunk for p in layer.parameters()]
    fired: dict[int, int] = {}
    mode = {"eager": True}

    def hook(p: torch.Tensor) -> None:
        fired[id(p)] = fired.get(id(p), 0) + 1
        if mode["eager"]:
            p.main_grad.add_(p.grad)
        p.grad = None

    for p in params:
        p.main_grad = torch.zeros_like(p)
        p.register_post_accumulate_grad_hook(hook)
    graphs = capture_plan(model, sampler(torch.float32), plan, fuse_wgrad_accumulation=True)
    order = rank_order(2, 0, 8, 2, 2)
    cp_of = {m: (1, 2)[m % 3 % 2] for m in range(8)}

    def eager(c: int, l: int, h: torch.Tensor, cp: int, m: int) -> torch.Tensor:
        return model[c][l](h)

    def graphed(c: int, l: int, h: torch.Tensor, cp: int, m: int) -> torch.Tensor:
        return graphs.layer(c, l)(h, cp_size=cp, microbatch=m)

    ref = run_schedule(eager, order, 2, (2, 2), cp_of, torch.float32)
    ref_main = [p.main_grad.clone() for p in params]
    ref_fired = dict(fired)
    fired.clear()
    for p in params:
        p.main_grad.zero_()
    mode["eager"] = False
    got = run_schedule(graphed, order, 2, (2, 2), cp_of, torch.float32)
    torch.cuda.synchronize()
    assert mismatches(ref, got) == []
    assert fired == ref_fired and len(fired) == len(params)
    assert all(torch.equal(a, p.main_grad) for a, p in zip(ref_main, params))
    assert all(p.grad is None for p in params)
    saved = params[0].main_grad
    params[0].main_grad = torch.zeros_like(saved)
    with pytest.raises(RuntimeError, match="main_grad buffer was replaced"):
        run_schedule(graphed, order, 2, (2, 2), cp_of, torch.float32)
    params[0].main_grad = saved
    assert graphs.layout.sizes[("pgrad", 0)] == 0  # every grad is fused: no scratch held beside main_grad
    graphs.close()
    unfused = capture_plan(make_layers((2, 2), torch.float32), sampler(torch.float32), plan)
    one_layer = sum(p.numel() * p.element_size() for p in model[0][0].parameters())
    assert unfused.layout.sizes[("pgrad", 0)] >= one_layer  # returned grads need the scratch
    unfused.close()


def test_variant_memory_is_max_not_sum() -> None:
    plan1 = plan_pipeline(2, 2, (4, 6, 8), (1,), 2).ranks[0]
    plan3 = plan_pipeline(2, 2, (4, 6, 8), (1, 2, 4), 2).ranks[0]
    model = make_layers((2, 2), torch.float32)
    one = capture_plan(model, sampler(torch.float32), plan1)
    m1 = one.memory().total
    one.close()
    del one
    three = capture_plan(model, sampler(torch.float32), plan3)
    m3 = three.memory().total
    three.close()
    # CP2 and CP4 frames are 1/2 and 1/4 of CP1's: the sum would be 1.75x
    assert m3 <= 1.05 * m1, (m1, m3)


def test_failed_capture_restores_process_state() -> None:
    import gc

    class Bad(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(HIDDEN, device="cuda"))
            self.calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self.calls += 1
            if torch.cuda.is_current_stream_capturing():
                raise RuntimeError("boom inside capture")
            return x * self.w

    plan = plan_pipeline(1, 1, (2,), (1, 2), 1).ranks[0]
    gc.enable()
    settings = alloc.parse_settings(torch._C._accelerator_getAllocatorSettings()) if hasattr(
        torch._C, "_accelerator_getAllocatorSettings") else {}
    with pytest.raises(CaptureError, match="boom"):
        make_graphed_callables([[Bad()]], sampler(torch.float32), plan.order, plan.records)
    assert gc.isenabled()
    if settings:
        assert alloc.parse_settings(torch._C._accelerator_getAllocatorSettings()) == settings
    assert not torch.cuda.is_current_stream_capturing()


def test_capture_warms_up_in_schedule_order_one_variant_at_a_time() -> None:
    from harness.slotmem.warmup import warmup_steps

    from tests.slotmem.oracles import held_frames

    plan = plan_pipeline(2, 2, (4, 6, 8), (1, 2), 2).ranks[0]
    model = make_layers((2, 2), torch.float32)
    calls: list[tuple[int, int, int]] = []  # (cp, chunk, layer) of every eager (warmup) forward

    def recorder(c: int, l: int) -> Callable[..., None]:
        def hook(module: torch.nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            if not torch.cuda.is_current_stream_capturing():
                calls.append((TOKENS // args[0].shape[0], c, l))
        return hook

    handles = [layer.register_forward_pre_hook(recorder(c, l)) for c, chunk in enumerate(model)
               for l, layer in enumerate(chunk)]
    graphs = capture_plan(model, sampler(torch.float32), plan, num_warmup_iters=2)
    for h in handles:
        h.remove()
    smap = build_slot_map(plan.records, (2, 2))
    steps = warmup_steps(plan.order, (2, 2), smap.variants, 2, smap.warmup_group)
    assert calls == [(s.cp_size, s.chunk, s.layer) for s in steps if s.forward]
    assert calls[:2] == [(2, 0, 0), (2, 0, 1)]  # one variant at a time, largest CP size first
    assert max(held_frames(steps)) < sum(s.forward for s in steps)  # consumed outputs were released
    assert graphs.stats is not None and graphs.stats.peak_allocated_during_warmup > 0
    graphs.close()
