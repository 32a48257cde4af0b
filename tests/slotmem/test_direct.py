"""CPU tests of direct writes into the arenas: producers found at warmup, ``out=`` redirect at capture."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from harness.slotmem.arenas import COMPONENT, NATIVE, ForwardPlan, contiguous_meta, frame_layout, view_at
from harness.slotmem.direct import Redirect, out_form
from harness.slotmem.saved import ArenaPacker, CaptureMismatch
from harness.slotmem.warmup import external_storages, ordered_warmup, warmup_steps


class Glu(torch.nn.Module):
    def __init__(self, hidden: int = 16) -> None:
        super().__init__()
        torch.manual_seed(3)
        self.norm = torch.nn.LayerNorm(hidden)
        self.fc1 = torch.nn.Linear(hidden, 4 * hidden)
        self.fc2 = torch.nn.Linear(2 * hidden, hidden)
        self.extra = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a, b = self.fc1(self.norm(x)).chunk(2, dim=-1)
        y = a * torch.sigmoid(b)
        if self.extra:
            y = y + 0  # one more op call before fc2: the call numbering no longer matches warmup
        return x + self.fc2(y)


class Router(torch.nn.Module):
    """Saves tensors made by the ops only the widened matcher writes in place: a dtype cast
    (``_to_copy``), ``topk`` (``topk.values``), ``argsort`` (``sort.values_stable``), ``index``
    (``index.Tensor_out``) and a sum over a dim (``sum.IntList_out``)."""

    def __init__(self, hidden: int = 16, experts: int = 4) -> None:
        super().__init__()
        torch.manual_seed(5)
        self.proj = torch.nn.Linear(hidden, hidden)
        self.gate = torch.nn.Linear(hidden, experts, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.proj(x)
        top_p, top_i = torch.softmax(self.gate(h), dim=-1).topk(2, dim=-1)
        order = torch.argsort(top_i[:, 0], stable=True)
        wide = h[order].double()
        mixed = (wide * torch.rsqrt((wide * wide).sum(-1, keepdim=True) + 1.0)).float()
        return x + mixed[torch.argsort(order, stable=True)] * top_p.sum(-1, keepdim=True)


def _plan(module: torch.nn.Module) -> ForwardPlan:
    sample = lambda cp, c, l: (torch.randn(64, 16, requires_grad=True),)  # noqa: E731
    return ordered_warmup({(0, 0): module}, sample, warmup_steps((1, -1), (1,), (1,), 2), require_cuda=False)[(1, 0, 0)]


def _capture_like(module: torch.nn.Module, plan: ForwardPlan, x: torch.Tensor, direct: bool, corrupt: bool = False) -> dict[str, Any]:
    """What capture does for one forward, on CPU and without a graph: arena views, packer, redirect."""
    fl = frame_layout(plan)
    backing = torch.zeros(fl.nbytes, dtype=torch.uint8)
    inp = view_at(backing, fl.inputs[0], contiguous_meta(x.shape, x.dtype)).requires_grad_()
    with torch.no_grad():
        inp.copy_(x)
    out_view = view_at(backing, fl.outputs[0], plan.output_view_meta(0))
    saved = [view_at(backing, fl.components[e.component] + e.rel_byte, e.meta) if e.kind == NATIVE else None
             for e in plan.saved]
    targets = {t: view_at(backing, fl.components[t[1]], m)
               for p in plan.producers for m, t in zip(p.returns, p.targets) if t is not None}
    packer = ArenaPacker("glu", plan.saved, saved, external_storages(module), (inp,))
    redirect = Redirect("glu", plan.producers if direct else (), targets, torch.device("cpu"))
    with torch.autograd.graph.saved_tensors_hooks(packer.pack, packer.unpack):
        with redirect:
            out = module(inp)
    redirect.finish()
    packer.finish()
    if corrupt:  # zero every saved component before the backward reads them
        for off, n in zip(fl.components, plan.components):
            backing[off:off + n].zero_()
    grads = torch.autograd.grad(out, [inp, *module.parameters()], torch.ones_like(out))
    return {"out": out, "out_view": out_view, "grads": grads, "copies": packer.copies,
            "redirected": redirect.redirected, "backing": backing}


def test_warmup_finds_the_ops_that_produce_saved_tensors_and_the_output() -> None:
    plan = _plan(Glu())
    ops = [p.op for p in plan.producers]
    assert "aten.addmm.default" in ops and "aten.sigmoid.default" in ops and "aten.mul.Tensor" in ops
    targets = [t for p in plan.producers for t in p.targets if t is not None]
    out = plan.output_places[0]
    assert out.kind == NATIVE and plan.output_alone(0)  # the output is a component of its own ...
    add = [p for p in plan.producers if (COMPONENT, out.component) in p.targets]
    assert [p.op for p in add] == ["aten.add.Tensor"]  # ... written by the residual add
    assert {k for kind, k in targets if kind == COMPONENT} == set(range(len(plan.components)))


def test_direct_writes_remove_the_copies_and_keep_results_bitwise() -> None:
    module = Glu()
    plan = _plan(module)
    x = torch.randn(64, 16)
    xr = x.clone().requires_grad_()
    ref = module(xr)
    ref_grads = torch.autograd.grad(ref, [xr, *module.parameters()], torch.ones_like(ref))
    copied = _capture_like(module, plan, x, direct=False)
    direct = _capture_like(module, plan, x, direct=True)
    assert copied["redirected"] == 0 and copied["copies"] == sum(e.kind == NATIVE for e in plan.saved)
    assert direct["copies"] == 0
    assert direct["redirected"] == len(plan.components)  # every saved component and the output
    assert direct["out"].data_ptr() == direct["out_view"].data_ptr()  # the output is in the arena already
    assert copied["out"].data_ptr() != copied["out_view"].data_ptr()
    for run in (copied, direct):
        assert all(torch.equal(a, b) for a, b in zip(ref_grads, run["grads"]))
    assert torch.equal(direct["out"], ref)
    # the backward really reads the directly written arena: corrupt it and the grads change
    run = _capture_like(module, plan, x, direct=True, corrupt=True)
    assert not torch.equal(run["grads"][0], ref_grads[0])


def test_redirect_fails_closed_when_the_ops_differ_from_warmup() -> None:
    module = Glu()
    plan = _plan(module)
    module.extra = True
    with pytest.raises(CaptureMismatch, match="warmup saw"):
        _capture_like(module, plan, torch.randn(64, 16), direct=True)


def test_a_callable_whose_ops_vary_gets_no_direct_writes() -> None:
    module = Glu()
    calls = {"n": 0}
    orig = module.forward

    def varying(x: torch.Tensor) -> torch.Tensor:
        calls["n"] += 1
        module.extra = calls["n"] % 2 == 0  # `y + 0` saves nothing: same saves, different op calls
        return orig(x)

    module.forward = varying  # type: ignore[method-assign]
    sample = lambda cp, c, l: (torch.randn(64, 16, requires_grad=True),)  # noqa: E731
    plans = ordered_warmup({(0, 0): module}, sample, warmup_steps((1, -1), (1,), (1,), 3), require_cuda=False)
    assert plans[(1, 0, 0)].producers == ()
    assert plans[(1, 0, 0)].components  # the rest of the plan is kept


@pytest.mark.parametrize("op, args, kwargs, form", [
    (torch.ops.aten.index.Tensor, lambda: (torch.randn(6, 3), [torch.tensor([4, 0, 2])]), {}, "index.Tensor_out"),
    (torch.ops.aten.sum.dim_IntList, lambda: (torch.randn(5, 4), [1], True), {}, "sum.IntList_out"),
    (torch.ops.aten.topk.default, lambda: (torch.randn(7, 5), 2, -1), {}, "topk.values"),
    (torch.ops.aten.sort.stable, lambda: (torch.randint(0, 3, (9,)),), {"stable": True}, "sort.values_stable"),
    (torch.ops.aten.mul.Scalar, lambda: (torch.randn(4, 4), 0.25), {}, "mul.Scalar_out"),
    (torch.ops.aten.addmm.default, lambda: (torch.randn(3), torch.randn(2, 4), torch.randn(4, 3)), {}, "addmm.out"),
    (torch.ops.aten._to_copy.default, lambda: (torch.randn(4, 6)[:, ::2],), {"dtype": torch.bfloat16}, "copy_"),
])
def test_out_forms_write_the_functional_result_bitwise(op, args, kwargs, form) -> None:
    a = args()
    found = out_form(op)
    assert found is not None and found.takes(a, kwargs)
    assert (str(found.overload).removeprefix("aten.") if found.overload is not None else "copy_") == form
    ref = op(*a, **kwargs)
    refs = ref if isinstance(ref, tuple) else (ref,)
    dsts = [torch.full_like(r, 7) for r in refs]  # poisoned, with the functional result's strides
    found.write(a, kwargs, dsts)
    for r, d in zip(refs, dsts):
        assert d.dtype == r.dtype and d.stride() == r.stride() and torch.equal(d, r)


def test_to_copy_is_redirected_only_when_it_changes_nothing_but_the_dtype() -> None:
    form = out_form(torch.ops.aten._to_copy.default)
    x = torch.randn(2, 3, 4, 5)
    assert form is not None and form.takes((x,), {"dtype": torch.float64, "layout": torch.strided})
    assert not form.takes((x,), {"memory_format": torch.channels_last})
    assert not form.takes((x,), {"device": torch.device("meta")})
    assert not form.takes((x,), {"non_blocking": True})
    assert out_form(torch.ops.aten.add_.Tensor) is None  # in place: nothing to redirect
    assert out_form(torch.ops.aten.view.default) is None  # returns an alias


def test_widened_forms_remove_every_copy_of_the_router_and_keep_results_bitwise() -> None:
    module = Router()
    plan = _plan(module)
    ops = {p.op for p in plan.producers}
    assert {"aten._to_copy.default", "aten.topk.default", "aten.sort.stable", "aten.index.Tensor",
            "aten.sum.dim_IntList"} <= ops
    x = torch.randn(64, 16)
    xr = x.clone().requires_grad_()
    ref = module(xr)
    ref_grads = torch.autograd.grad(ref, [xr, *module.parameters()], torch.ones_like(ref))
    direct = _capture_like(module, plan, x, direct=True)
    assert direct["copies"] == 0 and direct["redirected"] == len(plan.components)
    assert torch.equal(direct["out"], ref)
    assert all(torch.equal(a, b) for a, b in zip(ref_grads, direct["grads"]))
    corrupted = _capture_like(module, plan, x, direct=True, corrupt=True)
    assert not all(torch.equal(a, b) for a, b in zip(ref_grads, corrupted["grads"]))
