"""The static path's MoE with and without its padding rows, on this machine's GPU.

For one Qwen3-30B-A3B-shaped MoE layer (hidden 2048, 16 experts top-8, FFN 768, bf16 autocast,
deterministic) at each tokens-per-rank and fill (real tokens / buffer), forward + backward:

* the eager dispatch (per-expert matmuls, host-read counts: scope ``attn``'s MoE) and the grouped
  dispatch (grouped GEMMs over device-side offsets: scope ``full``), each over every buffer row
  (``padded``) and with the padding tokens left out (``skip``);
* whether ``skip`` equals ``padded`` on the real rows (outputs and input grads bitwise; parameter
  grads: max relative difference, since leaving rows out changes the GEMMs' shapes) and gives the
  padding rows exactly 0 (output and input grad).

    python bench/moe_padding.py [--tokens 4096 1024] [--fill 0.85]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.workload.ep import dispatch_and_compute, grouped_dispatch  # noqa: E402
from harness.workload.moe import MoE  # noqa: E402


def run(moe: MoE, x0: torch.Tensor, valid: torch.Tensor, grouped: bool, skip: bool, gy: torch.Tensor):
    x = x0.detach().requires_grad_()
    e, k = moe.num_experts, moe.top_k
    with torch.autocast("cuda", dtype=torch.bfloat16, cache_enabled=False):
        logits = torch.nn.functional.linear(x.float(), moe.router.weight.float())
        probs = torch.softmax(logits, dim=-1)
        top_p, top_i = probs.topk(k, dim=-1)
        w = (top_p / top_p.sum(dim=-1, keepdim=True)).to(x.dtype)
        mask = valid if skip else None
        if grouped:
            y = grouped_dispatch(x, top_i, w, moe.experts, e, mask)
        else:
            y = dispatch_and_compute(x, top_i, w, moe.experts, e, None, mask)
    y.backward(gy)
    return y.detach(), x.grad


def timed(fn, iters: int = 10, warm: int = 3) -> float:
    for _ in range(warm):
        fn()
    out = []
    for _ in range(iters):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        out.append(a.elapsed_time(b))
    return statistics.median(out)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 1024])
    p.add_argument("--fill", type=float, nargs="+", default=[0.85])
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("needs a CUDA GPU")
        return 0
    torch.use_deterministic_algorithms(True)
    dev = torch.device("cuda")
    torch.manual_seed(0)
    moe = MoE(2048, 16, 8, 768, 0.0).to(dev)
    with torch.no_grad():
        for prm in moe.parameters():
            prm.normal_(0, 0.02)
    rows = []
    for t in args.tokens:
        for fill in args.fill:
            n = int(t * fill)
            x0 = torch.randn(t, 2048, device=dev) * 0.5
            valid = torch.arange(t, device=dev) < n
            gy = torch.randn(t, 2048, device=dev) * 1e-3
            gy[~valid] = 0  # the loss masks padding: no gradient reaches it
            for grouped in (False, True):
                res = {}
                for skip in (False, True):
                    for prm in moe.parameters():
                        prm.grad = None
                    y, gx = run(moe, x0, valid, grouped, skip, gy)
                    grads = [prm.grad.clone() for prm in moe.experts.parameters()]
                    res[skip] = (y, gx, grads)
                    ms = timed(lambda: run(moe, x0, valid, grouped, skip, gy))
                    res[(skip, "ms")] = ms
                (y0, g0, p0), (y1, g1, p1) = res[False], res[True]
                same_y = torch.equal(y0[valid], y1[valid])
                same_g = torch.equal(g0[valid], g1[valid])
                zero_pad = bool((y1[~valid] == 0).all()) and bool((g1[~valid] == 0).all())
                rel = max(float((a - b).abs().max() / a.abs().max().clamp_min(1e-30)) for a, b in zip(p0, p1))
                finite = all(bool(torch.isfinite(g).all()) for g in p1)
                rows.append((t, fill, "grouped" if grouped else "eager", res[(False, "ms")], res[(True, "ms")],
                             same_y, same_g, zero_pad, rel, finite))
    print("| tokens | fill | dispatch | padded ms | skip ms | skip / padded | real rows y bitwise | "
          "real rows dx bitwise | padding y, dx = 0 | expert grads max rel diff | grads finite |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for t, fill, kind, a, b, sy, sg, zp, rel, fin in rows:
        print(f"| {t} | {fill:.2f} | {kind} | {a:.3f} | {b:.3f} | {b / a:.3f} | {sy} | {sg} | {zp} | {rel:.2e} | {fin} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
