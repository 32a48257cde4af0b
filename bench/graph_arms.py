"""Graph arms against plain graphs and both eager paths, from one run on this machine's GPU.

For every tokens-per-rank (``--tokens``, default 4096 and 1024) and graph scope (``attn``,
``full``) of ``cases/focused/gpu1-qwen3-graphs.yaml``, and today's eager path of
``cases/gpu/gpu1-qwen3-eager.yaml`` at the same tokens, every arm is trained in this one process
(one after another, ``train_arm`` as the harness runs it; the model's initial weights are built
once and reused, which changes no bit of them). The 4096 rows are the cases as written; the others
are the same cases with ``train.seq_length`` (and ``data.lengths.max``) set to the row's tokens,
derived and preflighted here. Reported, all from this run:

* step time of each arm (median over the graph-replaying steps, or the same steps of an eager arm);
* per graphed block, forward + backward: in the step (CUDA events around every block call and,
  through identity autograd nodes, around its backward) and alone (the block of chunk 0 / layer 0
  on the last microbatch's inputs, back to back: eager, slot-shared replay, and a plain
  ``torch.cuda.make_graphed_callables`` graph of that same block);
* the step time outside the graphed blocks (``rest``), and the **ideal** step: the static eager
  arm's rest plus every block call at the plain graph's time (the same steps, so the same
  microbatches); graph / ideal beside graph / eager (static) and graph / eager (today);
* graph vs eager bitwise (LM loss, aux loss, grad norm on every step);
* the graph arm's memory by parts (pool: arenas by kind, transients; device used over eager);
* with ``--profile-file``, a torch.profiler summary of the last step of every arm, from a second
  pass in a child process after the tables: Kineto leaves CUPTI loaded after a profile
  (pytorch/pytorch#144455), which slows every later kernel launch of that process, so no timed
  step ever shares a process with the profiler.

    python bench/graph_arms.py [--tokens 4096 1024] [--scopes attn full] [--steps 8]
                               [--json FILE] [--profile-file FILE]

Without CUDA the graph arms are skipped (with the reason) and the eager arms run on the CPU, which
is what tests/test_bench_graph_arms.py exercises with a tiny model.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import gc
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from harness.arms import arm_case  # noqa: E402
from harness.spec import load_cases  # noqa: E402
from harness.spec.preflight import preflight  # noqa: E402
from harness.spec.schema import Case  # noqa: E402

GRAPHS_CASE = ROOT / "cases/focused/gpu1-qwen3-graphs.yaml"
EAGER_CASE = ROOT / "cases/gpu/gpu1-qwen3-eager.yaml"
MIB = 2.0 ** 20
GIB = 2.0 ** 30


# ------------------------------------------------------------------------------------- cases
def at_tokens(case: Case, tokens: int, steps: int) -> Case:
    """``case`` with ``tokens`` per rank (fixed CP 1: ``train.seq_length``) and ``steps`` steps,
    preflighted like any case."""
    data = case.model_dump(mode="python")
    data["train"]["steps"] = steps
    if tokens != case.train.seq_length:
        data["train"]["seq_length"] = tokens
        data["data"]["lengths"]["max"] = min(data["data"]["lengths"]["max"], tokens)
        data["data"]["lengths"]["min"] = min(data["data"]["lengths"]["min"], tokens)
        data["id"] = f"{case.id}.t{tokens}"
    derived = Case.model_validate(data)
    problems = preflight(derived)
    if problems:
        raise SystemExit(f"{derived.id}: " + "; ".join(f"{p.field}: {p.message}" for p in problems))
    return derived


# ------------------------------------------------------------------------------------- timing
class HostEvent:
    """``torch.cuda.Event`` stand-in on the CPU (host clock)."""

    def __init__(self) -> None:
        self.t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: "HostEvent") -> float:
        return (end.t - self.t) * 1e3


def new_event(cuda: bool) -> Any:
    return torch.cuda.Event(enable_timing=True) if cuda else HostEvent()


class _Mark(torch.autograd.Function):
    """Identity; records ``event`` when its gradient passes (a point in the backward)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, event: Any) -> torch.Tensor:  # type: ignore[override]
        ctx.event = event
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:  # type: ignore[override]
        ctx.event.record()
        return grad, None


@dataclasses.dataclass
class BlockCall:
    key: tuple[int, int]
    events: list  # forward start, forward end, backward start, backward end


class BlockClock:
    """Wraps a static microbatch's block runner: events around each block call's forward and
    backward; the last call of block (0, 0) keeps its inputs for the isolated timings."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.calls: list[BlockCall] = []
        self.per_step: dict[int, list[tuple[float, float]]] = {}
        self.sample: Optional[dict] = None

    def wrap(self, run: Callable, cp_size: int, microbatch: int, cp: Any) -> Callable:
        def timed(block: Any, key: tuple[int, int], inputs: tuple) -> Any:
            ev = [new_event(self.cuda) for _ in range(4)]
            self.calls.append(BlockCall(key, ev))
            if key == (0, 0):
                self.sample = dict(block=block, inputs=tuple(t.detach() for t in inputs),
                                   cp_size=cp_size, microbatch=microbatch, cp=cp)
            h = _Mark.apply(inputs[0], ev[3]) if inputs[0].requires_grad else inputs[0]
            ev[0].record()
            out = run(block, key, (h, *inputs[1:]))
            ev[1].record()
            if isinstance(out, tuple):
                return (_Mark.apply(out[0], ev[2]), *out[1:])
            return _Mark.apply(out, ev[2])
        return timed

    def end_step(self, step: int) -> None:
        if self.cuda:
            torch.cuda.synchronize()
        rows = []
        for c in self.calls:
            f0, f1, b0, b1 = c.events
            rows.append((f0.elapsed_time(f1), b0.elapsed_time(b1)))
        self.per_step[step] = rows
        self.calls = []


def _fwd_bwd(fn: Callable[[torch.Tensor], Any], x0: torch.Tensor) -> Callable[[], None]:
    grad: dict[str, torch.Tensor] = {}

    def once() -> None:
        x = x0.detach().requires_grad_()
        out = fn(x)
        y = out[0] if isinstance(out, tuple) else out
        if "g" not in grad:
            gen = torch.Generator(device=y.device).manual_seed(7)
            grad["g"] = torch.randn(y.shape, generator=gen, device=y.device, dtype=y.dtype) * 1e-3
        y.backward(grad["g"])
    return once


def time_ms(once: Callable[[], None], cuda: bool, iters: int = 10, warm: int = 3) -> float:
    """Median wall time of ``once`` (forward + backward), back to back, after ``warm`` calls."""
    for _ in range(warm):
        once()
    times = []
    for _ in range(iters):
        a, b = new_event(cuda), new_event(cuda)
        if cuda:
            torch.cuda.synchronize()
        a.record()
        once()
        b.record()
        if cuda:
            torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def isolated_block_times(sample: dict, graphs: Any, cuda: bool) -> dict[str, float]:
    """Block (0, 0) alone on the last microbatch's inputs: eager, slot-shared replay, plain graph."""
    block, inputs = sample["block"], sample["inputs"]
    rest = inputs[1:]
    block.cp = sample["cp"]
    out: dict[str, float] = {}
    if graphs is not None:
        # A copy of the block with parameters of its own: the training's parameters carry autograd
        # state from eager steps on the default stream, which a capture must not touch.
        twin = copy.deepcopy(block)
        torch.cuda.synchronize()
        free0 = torch.cuda.mem_get_info()[0]
        plain = torch.cuda.make_graphed_callables(
            twin, (inputs[0].detach().clone().requires_grad_(), *rest), num_warmup_iters=3)
        torch.cuda.synchronize()
        out["plain_graph_pool_mib"] = (free0 - torch.cuda.mem_get_info()[0]) / MIB
        out["plain_graph_ms"] = time_ms(_fwd_bwd(lambda x: plain(x, *rest), inputs[0]), cuda)
        del plain, twin
        gc.collect()  # modules hold reference cycles: free the plain graph's pool before the next arm
    out["eager_ms"] = time_ms(_fwd_bwd(lambda x: block(x, *rest), inputs[0]), cuda)
    if graphs is not None:
        out["replay_ms"] = time_ms(_fwd_bwd(
            lambda x: graphs.call(0, 0, (x, *rest), sample["cp_size"], sample["microbatch"], sample["cp"]),
            inputs[0]), cuda)
    return out


# ------------------------------------------------------------------------------------- saves
def saved_tensor_sources(block: Any, inputs: tuple) -> list[str]:
    """Why each saved component of ``block``'s forward is copied into its arena, not written
    there: the op that first produced its storage, and whether the direct-write matcher
    (``slotmem.direct``) took it. One warmup-style forward (no backward), on ``inputs``."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from harness.slotmem.arenas import NATIVE, TensorMeta, component_spans
    from harness.slotmem.direct import OpTracer, find_producers
    try:
        from harness.slotmem.direct import out_form
    except ImportError:  # an older tree (the bench measures a baseline checkout too)
        from harness.slotmem.direct import _out_names as out_form  # type: ignore[attr-defined,no-redef]
    from harness.slotmem.saved import SaveObserver
    from harness.slotmem.warmup import external_storages

    class AllOps(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.first: dict[int, tuple[str, Any, Any]] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            out = func(*args, **(kwargs or {}))
            rets = out if isinstance(out, (tuple, list)) else (out,)
            for r in rets:
                if isinstance(r, torch.Tensor) and r.numel() and type(r) is torch.Tensor:
                    self.first.setdefault(r.untyped_storage().data_ptr(), (str(func), func, TensorMeta.of(r)))
            return out

    ins = tuple(t.detach().clone().requires_grad_(t.requires_grad) for t in inputs)
    obs = SaveObserver(external_storages(block), ins)
    tracer, allops = OpTracer(), AllOps()
    with torch.autograd.graph.saved_tensors_hooks(obs.pack, obs.unpack), tracer, allops:
        outs = block(*ins)
    outs = outs if isinstance(outs, tuple) else (outs,)
    obs.observe_outputs(outs)
    comps = component_spans(obs.raw, obs.outputs)
    producers, _ = find_producers(tracer.traced, comps)
    covered = {t[1] for p in producers for t in p.targets if t is not None}
    saves_of: dict[int, int] = {}
    keys = [c[0] for c in comps]
    for kind, key, _, _ in obs.raw:
        if kind == NATIVE:
            saves_of[keys.index(key)] = saves_of.get(keys.index(key), 0) + 1
    by_op: dict[str, list] = {}
    for k, (key, lo, hi) in enumerate(comps):
        op, func, meta = allops.first.get(key, ("<not produced by an op here>", None, None))
        if k in covered:
            why = "direct"
        elif func is None:
            why = "unknown producer"
        elif out_form(func) is None:
            why = "op has no usable out= form"
        else:
            span = (meta.start_byte, meta.start_byte + meta.extent_bytes)
            why = f"traced, refused (return {meta.shape} strides {meta.stride}, saved bytes [{lo},{hi}) of {span})"
        entry = by_op.setdefault(f"{op}: {why}", [0, 0, 0])
        entry[0] += 1
        entry[1] += saves_of.get(k, 0)
        entry[2] += hi - lo
    lines = [f"{len(comps)} components, {sum(saves_of.values())} native saves, {len(covered)} components direct"]
    for name, (n, saves, nbytes) in sorted(by_op.items(), key=lambda kv: -kv[1][2]):
        lines.append(f"  {n:3d} comps {saves:3d} saves {nbytes / MIB:9.1f} MiB  {name}")
    del outs, ins, obs, tracer, allops
    return lines


# ------------------------------------------------------------------------------------- memory
def memory_parts(graphs: Any) -> dict[str, float]:
    """The graph arm's pool by parts (MiB): arenas by kind, static inputs inside them, transients."""
    parts: dict[str, float] = {}
    owners = list({id(g): g for g in graphs._graphs.values()}.values())
    for g in owners:
        mem = g.memory()
        parts["pool_reserved"] = parts.get("pool_reserved", 0.0) + mem.pool_reserved / MIB
        parts["arenas"] = parts.get("arenas", 0.0) + mem.backing / MIB
        parts["transients"] = parts.get("transients", 0.0) + (mem.pool_reserved - mem.backing) / MIB
        for (kind, _), n in g.layout.sizes.items():
            parts[f"arena_{kind}"] = parts.get(f"arena_{kind}", 0.0) + n / MIB
        # inputs with bytes of their own (a chained input is the previous layer's output view)
        outputs = {o.data_ptr() for f in g.frames.values() for o in f.static_outputs}
        inputs = sum(t.numel() * t.element_size() for f in g.frames.values() for t in f.static_inputs
                     if t.data_ptr() not in outputs
                     and t.untyped_storage().data_ptr() == g.backing.untyped_storage().data_ptr())
        parts["frame_static_inputs"] = parts.get("frame_static_inputs", 0.0) + inputs / MIB
        st = g.stats
        if st is not None:
            parts["direct_writes"] = parts.get("direct_writes", 0) + st.direct_writes
            parts["copies"] = parts.get("copies", 0) + st.copies
    return parts


# ------------------------------------------------------------------------------------- one arm
@contextlib.contextmanager
def patched(clock: BlockClock, keep: dict, init_cache: dict) -> Iterator[None]:
    """Instrument ``train_arm`` from outside: block runners timed, the captured graphs kept for
    the isolated timings, the model's initial weights built once per process."""
    from harness.workload import model, train

    orig_static, orig_capture, orig_init = train._static_input, train._capture, model.init_chunk

    def static_input(*args):  # type: ignore[no-untyped-def]  (whatever the workload passes)
        mb = orig_static(*args)
        st = mb.ctx.static
        run = clock.wrap(st.run, st.cp_size, st.microbatch, st.cp)
        ctx = dataclasses.replace(mb.ctx, static=dataclasses.replace(st, run=run))
        return dataclasses.replace(mb, ctx=ctx)

    def capture(case, s):  # type: ignore[no-untyped-def]
        keep["graphs"] = orig_capture(case, s)
        return keep["graphs"]

    def init_chunk(chunk, m, seed, first_expert=0, threads=1):  # type: ignore[no-untyped-def]
        key = (tuple(chunk.layer_ids), chunk.first, chunk.last, seed, first_expert, repr(m))
        if key not in init_cache:
            orig_init(chunk, m, seed, first_expert, threads=threads)
            init_cache[key] = {k: v.detach().clone() for k, v in chunk.state_dict().items()}
        else:
            chunk.load_state_dict(init_cache[key])

    train._static_input, train._capture, model.init_chunk = static_input, capture, init_chunk
    try:
        yield
    finally:
        train._static_input, train._capture, model.init_chunk = orig_static, orig_capture, orig_init


def _profile_table(prof: Any, limit: int = 25) -> tuple[str, float]:
    avgs = prof.key_averages()
    dev_key = "self_device_time_total" if hasattr(avgs[0], "self_device_time_total") else "self_cuda_time_total"
    lines = []
    for sort in (dev_key, "self_cpu_time_total"):
        try:
            lines.append(f"-- sorted by {sort}\n" + avgs.table(sort_by=sort, row_limit=limit, max_name_column_width=60))
        except Exception as err:  # noqa: BLE001 - a profiler table is a report, never a failure
            lines.append(f"-- sorted by {sort}: {err}")
    kernels = sum(getattr(e, dev_key, 0) for e in avgs
                  if str(getattr(e, "device_type", "")).endswith("CUDA")) / 1e3
    lines.append(f"-- GPU kernel + memcpy time in the profiled step: {kernels:.1f} ms")
    return "\n".join(lines), kernels


def run_arm(case: Case, cuda: bool, init_cache: dict, profile: bool = False) -> dict:
    """Train one arm in this process; ``profile``: profile its last step instead of timing and
    diagnosing it (the profile pass)."""
    from harness.workload import RankContext, train_arm

    dev = "cuda:0" if cuda else "cpu"
    ctx = RankContext(0, 1, 0, dev, "none")
    clock = BlockClock(cuda)
    keep: dict = {}
    records: list = []
    result: dict = {"case": case.id, "arm": case.arm}
    steps = case.train.steps
    prof_box: dict = {}

    def on_step(r: Any) -> None:
        clock.end_step(r.step)
        records.append(r)
        if profile and r.step == steps - 1:
            acts = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
            prof_box["p"] = torch.profiler.profile(activities=acts)
            prof_box["p"].start()
        if r.step == steps:
            for name, fn in _last_step_diagnostics(r)[: 1 if profile else None]:
                try:
                    fn()
                except Exception:  # noqa: BLE001 - a failed diagnostic is reported, the run goes on
                    import traceback

                    result.setdefault("diagnostic_errors", []).append(f"{name}: {traceback.format_exc()}")
                    print(f"{name} failed:\n{traceback.format_exc()}", flush=True)

    def _last_step_diagnostics(r: Any) -> list:
        graphs, smp = keep.get("graphs"), clock.sample

        def prof() -> None:
            if "p" in prof_box:
                prof_box["p"].stop()
                result["profile"], result["profile_gpu_ms"] = _profile_table(prof_box["p"])
                result["profile_step_ms"] = r.step_time_s * 1e3

        def mem() -> None:
            if graphs is not None:
                result["memory_parts"] = memory_parts(graphs)
                result["capture_line"] = graphs.stats.summary

        def saves() -> None:
            if smp is not None and graphs is not None:
                smp["block"].cp = smp["cp"]
                result["saves"] = saved_tensor_sources(smp["block"], smp["inputs"])

        def isolated() -> None:
            if smp is not None:
                result["isolated"] = isolated_block_times(smp, graphs, cuda)

        return [("profile", prof), ("memory parts", mem), ("saved tensors", saves), ("isolated timings", isolated)]

    t0 = time.perf_counter()
    with patched(clock, keep, init_cache):
        train_arm(case, ctx, on_step)
    result["wall_s"] = time.perf_counter() - t0
    keep.clear()
    timed_last = steps
    result["records"] = [dict(step=r.step, loss=r.loss, aux=r.aux_loss, grad_norm=r.grad_norm,
                              graphed=r.graphed, ms=r.step_time_s * 1e3, microbatches=r.microbatches,
                              blocks=clock.per_step.get(r.step, []),
                              device_used=r.memory_probe.device_used_bytes if r.memory_probe else None,
                              peak_alloc=r.max_allocated_bytes, reserved=r.reserved_bytes)
                         for r in records]
    result["timed_steps"] = [r.step for r in records if 3 <= r.step <= timed_last]
    return result


# ------------------------------------------------------------------------------------- tables
def _ratio(a: Optional[float], b: Optional[float]) -> str:
    return f"{a / b:.3f}" if a and b else "-"


def _med(xs: list[float]) -> Optional[float]:
    return statistics.median(xs) if xs else None


def summarize(arm: dict, steps: list[int]) -> dict:
    recs = {r["step"]: r for r in arm["records"]}
    rows = [recs[s] for s in steps if s in recs]
    block = [sum(f + b for f, b in r["blocks"]) for r in rows]
    calls = [len(r["blocks"]) for r in rows]
    fwd = [f for r in rows for f, _ in r["blocks"]]
    bwd = [b for r in rows for _, b in r["blocks"]]
    return dict(
        step_ms=_med([r["ms"] for r in rows]),
        block_ms=_med(block),
        rest_ms=_med([r["ms"] - b for r, b in zip(rows, block)]),
        calls=_med(calls),
        call_fwd_ms=_med(fwd), call_bwd_ms=_med(bwd),
        rest_by_step={r["step"]: r["ms"] - b for r, b in zip(rows, block)},
        calls_by_step={r["step"]: c for r, c in zip(rows, calls)},
        device_used_gib=max((r["device_used"] or 0) for r in arm["records"]) / GIB,
        peak_alloc_gib=max((r["peak_alloc"] or 0) for r in arm["records"]) / GIB,
        reserved_gib=max((r["reserved"] or 0) for r in arm["records"]) / GIB,
    )


def bitwise(a: dict, b: dict) -> str:
    keys = ("loss", "aux", "grad_norm")
    ra, rb = a["records"], b["records"]
    if len(ra) != len(rb):
        return "different step counts"
    bad = [(x["step"], k) for x, y in zip(ra, rb) for k in keys if x[k] != y[k]]
    return "bitwise on every step" if not bad else f"DIFFERS at {bad[:4]}"


def fmt(v: Any, spec: str = ".1f") -> str:
    if v is None:
        return "-"
    if isinstance(v, int) or (isinstance(v, float) and v.is_integer() and spec == ".1f" and abs(v) >= 100):
        return str(int(v))
    return format(v, spec) if isinstance(v, (int, float)) else str(v)


def table(header: list[str], rows: list[list[Any]]) -> str:
    out = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    out += ["| " + " | ".join(fmt(v) if not isinstance(v, str) else v for v in row) + " |" for row in rows]
    return "\n".join(out)


def report(results: dict) -> str:
    step_rows, block_rows, ratio_rows, mem_rows, notes = [], [], [], [], []
    for tokens in sorted({k[0] for k in results}, reverse=True):
        today = results.get((tokens, "today", "eager"))
        for scope in ("attn", "full"):
            eager, graph = results.get((tokens, scope, "eager")), results.get((tokens, scope, "graph"))
            if eager is None:
                continue
            if graph is not None and "records" in graph:
                steps = graph["timed_steps"]
            else:
                steps = eager["timed_steps"]
            se = summarize(eager, steps)
            sg = summarize(graph, steps) if graph is not None and "records" in graph else None
            st = summarize(today, steps) if today is not None else None
            for name, s in (("eager (static)", se), ("graph", sg)):
                if s is not None:
                    step_rows.append([tokens, scope, name, s["step_ms"], s["calls"], s["block_ms"], s["rest_ms"],
                                      s["call_fwd_ms"], s["call_bwd_ms"], s["peak_alloc_gib"], s["reserved_gib"],
                                      s["device_used_gib"]])
            iso = (graph or {}).get("isolated") or eager.get("isolated") or {}
            block_rows.append([tokens, scope, se["call_fwd_ms"] + se["call_bwd_ms"] if se["call_fwd_ms"] else None,
                               (sg["call_fwd_ms"] + sg["call_bwd_ms"]) if sg and sg["call_fwd_ms"] else None,
                               iso.get("eager_ms"), iso.get("replay_ms"), iso.get("plain_graph_ms"),
                               iso.get("plain_graph_pool_mib")])
            ideal = ideal_own = None
            if sg is not None and iso.get("plain_graph_ms") is not None:
                plain = iso["plain_graph_ms"]
                ideal = _med([se["rest_by_step"][s] + se["calls_by_step"][s] * plain
                              for s in steps if s in se["rest_by_step"]])
                ideal_own = _med([sg["rest_by_step"][s] + sg["calls_by_step"][s] * plain
                                  for s in steps if s in sg["rest_by_step"]])
            g = sg["step_ms"] if sg else None
            ratio_rows.append([tokens, scope, g, ideal, ideal_own, se["step_ms"], st["step_ms"] if st else None,
                               _ratio(g, ideal), _ratio(g, ideal_own), _ratio(g, se["step_ms"]),
                               _ratio(g, st["step_ms"] if st else None),
                               _ratio(se["step_ms"], st["step_ms"] if st else None)])
            if sg is not None:
                notes.append(f"t{tokens} {scope}: graph vs eager {bitwise(graph, eager)}; "
                             f"{graph.get('capture_line', '')}")
                if graph.get("saves"):
                    notes.append(f"t{tokens} {scope}: saved tensors of block (0, 0): " + graph["saves"][0])
                    notes.extend(graph["saves"][1:])
                mp = graph.get("memory_parts", {})
                mem_rows.append([tokens, scope, se["device_used_gib"] * 1024, sg["device_used_gib"] * 1024,
                                 (sg["device_used_gib"] - se["device_used_gib"]) * 1024, mp.get("pool_reserved"),
                                 mp.get("arenas"), mp.get("arena_saved"), mp.get("frame_static_inputs"),
                                 mp.get("arena_grad"), mp.get("arena_gout"), mp.get("arena_pgrad"),
                                 mp.get("transients"),
                                 (sg["device_used_gib"] - se["device_used_gib"]) * 1024 - (mp.get("pool_reserved") or 0),
                                 f"{int(mp.get('direct_writes', 0))} / {int(mp.get('copies', 0))}"])
        if today is not None:
            s = summarize(today, today["timed_steps"])
            step_rows.append([tokens, "-", "eager (today)", s["step_ms"], 0, 0.0, s["step_ms"], None, None,
                              s["peak_alloc_gib"], s["reserved_gib"], s["device_used_gib"]])
    out = [
        "Step time by parts (median over the timed steps; block = CUDA events around every graphed "
        "block's forward and backward in the step; rest = step - blocks):",
        table(["tokens", "scope", "arm", "step ms", "block calls", "blocks ms", "rest ms", "call fwd ms",
               "call bwd ms", "peak alloc GiB", "reserved GiB", "device used GiB"], step_rows),
        "",
        "One block (chunk 0, layer 0), forward + backward, ms: in the step (per call) and alone "
        "(back to back on the last microbatch's inputs):",
        table(["tokens", "scope", "eager in step", "replay in step", "eager alone", "replay alone",
               "plain graph alone", "plain graph pool MiB"], block_rows),
        "",
        "Graph arm against the ideal (the static eager arm's rest + every block call at the plain graph's "
        "time; also with the graph arm's own rest, which is shorter where the host runs ahead) and both "
        "eager paths:",
        table(["tokens", "scope", "graph ms", "ideal ms", "ideal (graph's rest) ms", "static eager ms",
               "today's eager ms", "graph / ideal", "graph / ideal (graph's rest)", "graph / static",
               "graph / today", "static / today"], ratio_rows),
        "",
        "Memory (MiB): device used after the last step's empty_cache, eager vs graph, and the graph "
        "arm's pool by parts (arenas: saved frames incl. static inputs, returned input grads, output-grad "
        "and param-grad scratch; transients = pool - arenas; other = extra - pool):",
        table(["tokens", "scope", "eager used", "graph used", "extra", "pool", "arenas", "saved", "of which inputs",
               "grad", "gout", "pgrad", "transients", "other", "direct / copied"], mem_rows),
        "",
        *notes,
    ]
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, nargs="+", default=[4096, 1024])
    p.add_argument("--scopes", nargs="+", default=["attn", "full"], choices=["attn", "full"])
    p.add_argument("--steps", type=int, default=8, help="steps per arm (timed: the graph-replaying ones)")
    p.add_argument("--graphs-case", type=Path, default=GRAPHS_CASE)
    p.add_argument("--eager-case", type=Path, default=EAGER_CASE)
    p.add_argument("--no-today", action="store_true", help="skip today's eager path")
    p.add_argument("--profile-file", type=Path, default=None,
                   help="then profile every arm's last step in a child process and write the summaries here")
    p.add_argument("--profile-pass", action="store_true", help=argparse.SUPPRESS)  # the child's mode
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--report-from", type=Path, default=None,
                   help="print the tables of an earlier run's --json file (nothing is run)")
    args = p.parse_args(argv)
    if args.report_from is not None:
        saved = json.loads(args.report_from.read_text())
        print(report({(int(k.split("/")[0]), *k.split("/")[1:]): v for k, v in saved.items()}))
        return 0
    cuda = torch.cuda.is_available()
    if cuda:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    else:
        print(f"torch {torch.__version__}, no CUDA: graph arms skipped (they replay CUDA graphs)", flush=True)
    graph_cases = {c.graphs.scope: c for c in load_cases([args.graphs_case]) if c.graphs is not None}
    eager_cases = load_cases([args.eager_case])
    profile = args.profile_pass
    if profile and args.profile_file is None:
        raise SystemExit("--profile-pass needs --profile-file")
    init_cache: dict = {}
    results: dict = {}
    for tokens in args.tokens:
        plan = []
        if not args.no_today:
            plan.append(("today", "eager", arm_case(at_tokens(eager_cases[0], tokens, args.steps), "eager")))
        for scope in args.scopes:
            base = at_tokens(graph_cases[scope], tokens, args.steps)
            plan.append((scope, "eager", arm_case(base, "eager")))
            if cuda:
                plan.append((scope, "graph", arm_case(base, "graph")))
        for scope, arm, case in plan:
            print(f"== {case.id} / {arm}", flush=True)
            try:
                res = run_arm(case, cuda, init_cache, profile)
            except Exception:  # noqa: BLE001 - one failed arm is reported, the others still run
                import traceback

                traceback.print_exc()
                continue
            results[(tokens, scope, arm)] = res
            print(f"   {res['wall_s']:.1f}s; step ms " + " ".join(f"{r['ms']:.1f}" for r in res["records"]), flush=True)
            if profile and "profile" in res:
                with args.profile_file.open("a") as f:
                    f.write(f"==== {case.id} / {arm}: profiled step {res['profile_step_ms']:.1f} ms, GPU time "
                            f"{res['profile_gpu_ms']:.1f} ms\n{res['profile']}\n\n")
            gc.collect()  # what an arm leaves in reference cycles must not count in the next one's memory
            if cuda:
                torch.cuda.empty_cache()
            if args.json is not None and not profile:  # after every arm: a run cut short keeps what it measured
                args.json.write_text(json.dumps({f"{t}/{s}/{a}": {k: v for k, v in r.items() if k != "profile"}
                                                 for (t, s, a), r in results.items()}, indent=1, default=str))
    if profile:
        return 0
    print()
    print(report(results))
    if args.profile_file is not None:
        child = [sys.executable, str(Path(__file__).resolve()), "--profile-pass", "--profile-file",
                 str(args.profile_file), "--tokens", *map(str, args.tokens), "--scopes", *args.scopes,
                 "--steps", str(args.steps), "--graphs-case", str(args.graphs_case),
                 "--eager-case", str(args.eager_case)] + (["--no-today"] if args.no_today else [])
        print(f"\nprofile pass (child process): {' '.join(child[1:])}", flush=True)
        return subprocess.call(child)
    return 0


if __name__ == "__main__":
    sys.exit(main())
