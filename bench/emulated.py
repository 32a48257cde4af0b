"""Emulated ranks of a graph case on one GPU: the table of TE #3353's validation beside ours.

Each chosen rank runs alone as rank r of the case's world (``harness.workload.emulate``: real
layout, groups, data shard, packing and CP choice, PP/VPP schedule, slot plan, capture, replay;
communication on the loopback layer), one arm after another, ranks one after another:

  dcp                   eager dynamic CP (the graph arm's eager twin)       train.steps
  graph                 DCP + slot-shared CUDA graphs                       train.steps
  graph-fixed-cp<N>     fixed CP N + graphs (compare.dcp_vs_fixed_cp)       up to the memory probe
  graph-separate-pools  one pool per CP size (the sum baseline)             up to the probe / capture

Per rank: no NaN / skipped step; graph vs eager bitwise (loss, aux loss, grad norm of every step);
the capture line; forward replays per (CP size, physical slot) frame over the graphed steps; graph
pool and arena bytes; slot-shared pool / largest single variant and separate pools / largest;
DCP+graph vs fixed-CP+graph after empty_cache at ``train.memory_probe_step``: whole-device used
(MiB, % of the device), active and reserved deltas; compute step time (median over the graphed
steps; nothing is communicated); and the reserved delta explained: the live blocks of both arms
at the probe by pool and allocation site, the largest differences first.

Losses and gradient norms of an emulated rank are its local figures (no rank sends it anything
real): they are compared graph vs eager, never against a reference or golden values. Every line
names the rank as ``emulated rank r of N``.

Run on a GPU (the repository root on PYTHONPATH, or from the root):
  python bench/emulated.py CASE.yaml [--ranks 0,7] [--out DIR] [--json FILE] [--deadline-s S]
Step records go to DIR/<case>/<arm>/rank<r>.jsonl (the harness's results layout).
Exit status: 0 every check of every rank that ran passed, 1 a check failed, 2 nothing ran, 3 the
bench itself crashed; with --fit-steps N (only: does the first rank fit? its eager arm for N steps,
the peak extrapolated to the most forwards its schedule can hold) 0 fits, 4 does not.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import traceback
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Optional

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from harness.arms import arm_case, arm_spec  # noqa: E402
from harness.results import StepRecord, StepWriter, dumps  # noqa: E402
from harness.spec.loader import load_cases  # noqa: E402
from harness.spec.preflight import preflight  # noqa: E402
from harness.spec.schema import Case  # noqa: E402
from harness.workload.allocsites import diff_sites, pool_totals  # noqa: E402
from harness.workload.emulate import EmulatedArm, WeightCache, emulate_rank, rank_place, stage_ranks  # noqa: E402

MiB = 2**20
GRAPH, SEPARATE = "graph", "graph-separate-pools"

# TE PR #3353's own validation (8 GB200s, real ranks; the issue / reference/te_megatron.md 1.9)
TE = {
    "layout": "8 GB200 (2 nodes), real ranks; 48 layers, 128 experts, PP4 VPP4 EP2, DCP {1,2}, seq 8192, GBS 64",
    "capture": "2 dynamic-CP variants over 8 slot-aliased physical TE pool slots",
    "graph_vs_eager": "16 steps, no NaN / skipped; LM loss within 0.00398 abs (0.0351 %)",
    "device_delta": "-440..+16 and -366..+96 MiB (two 3-step runs)",
    "device_delta_pct": "largest +0.1001 %",
    "active_delta": "+80..+272 MiB",
    "reserved_delta": "+758..+1296 MiB (left for follow-up profiling)",
    "pool_ratio": "not reported ('no multiplicative growth with two CP variants')",
}


@dataclass
class RankRun:
    """One emulated rank: its arms' records and what they left."""

    rank: int
    label: str
    records: dict[str, list[StepRecord]] = field(default_factory=dict)
    arms: dict[str, EmulatedArm] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)
    param_bytes: int = 0


class _Sink:
    """One arm's step records: kept, and written to ``<out>/<case>/<arm>/rank<r>.jsonl``."""

    def __init__(self, arm_dir: Path, rank: int) -> None:
        self.arm_dir, self.rank = arm_dir, rank
        self.records: list[StepRecord] = []
        self.reset()

    def reset(self) -> None:
        self.records.clear()
        self.writer = StepWriter(self.arm_dir, self.rank, resume=False)

    def append(self, record: StepRecord) -> None:
        self.records.append(record)
        self.writer.append(record)


def with_steps(case: Case, steps: int) -> Case:
    """``case`` trained for ``steps`` steps (a derived case; the same preflight)."""
    data = case.model_dump(mode="python")
    data["train"]["steps"] = steps
    probe = data["train"].get("memory_probe_step")
    if probe is not None and probe > steps:
        data["train"]["memory_probe_step"] = steps
    derived = Case.model_validate(data)
    problems = preflight(derived)
    if problems:
        raise SystemExit(f"{case.id}: {steps} steps cannot run: "
                         + "; ".join(f"{p.field}: {p.message}" for p in problems))
    return derived


def arm_names(case: Case) -> list[str]:
    """``dcp``, ``graph``, ``graph-fixed-cp<N>`` (N of compare.dcp_vs_fixed_cp, default 2),
    ``graph-separate-pools``."""
    fixed = case.compare.dcp_vs_fixed_cp.fixed_cp if case.compare.dcp_vs_fixed_cp else 2
    return [arm_spec(case, name).name for name in ("eager", GRAPH, f"graph-fixed-cp{fixed}", SEPARATE)]



def plan_arms(case: Case) -> list[tuple[str, Case]]:
    """The arms an emulated rank runs, each as the derived case it trains: the eager and graph
    arms every step, the other two up to the memory probe (and the capture)."""
    if case.graphs is None or not case.layout.dynamic:
        raise SystemExit(f"{case.id}: bench/emulated.py needs a dynamic-CP graph case (graphs: and "
                         "parallel.dynamic_cp)")
    probe = case.train.memory_probe_step or case.train.steps
    short = max(probe, case.graphs.warmup_steps + 1)
    steps = [case.train.steps, case.train.steps, short, short]
    return [(name, with_steps(arm_case(case, name), n)) for name, n in zip(arm_names(case), steps)]


def run_rank(case: Case, rank: int, arms: list[tuple[str, Case]], cache: WeightCache, out: Path,
             deadline: float) -> RankRun:
    run = RankRun(rank, rank_place(case, rank).label(), param_bytes=cache.param_bytes(case, rank))
    for name, arm in arms:
        if time.monotonic() > deadline:
            run.skipped[name] = "not run: the --deadline-s passed"
            print(f"[{run.label}] {name}: skipped (deadline)", flush=True)
            continue
        sink = _Sink(out / case.id / name, rank)
        recs = sink.records
        sites = name in (GRAPH, arms[2][0])
        res, error = _attempt(arm, rank, sink, cache, sites)
        if res is None and sites and "out of memory" not in error:
            # the figures matter more than the site table: once more without recording sites
            print(f"[{run.label}] {name}: failed with allocation sites recorded; again without", flush=True)
            run.errors[f"{name} (sites)"] = f"failed with allocation sites recorded ({error}); ran without"
            sink.reset()
            res, error = _attempt(arm, rank, sink, cache, False)
        if res is None:
            run.errors[name] = error
            run.records[name] = recs
            continue
        run.records[name], run.arms[name] = recs, res
        times = [r.step_time_s for r in recs[1:] if r.step_time_s is not None]
        print(f"[{run.label}] {name}: done in {res.wall_s:.1f}s, median step "
              f"{statistics.median(times) if times else float('nan'):.3f}s, "
              f"peak allocated {max(r.max_allocated_bytes or 0 for r in recs) / MiB:.0f} MiB", flush=True)
    return run


def _attempt(arm: Case, rank: int, sink: _Sink, cache: WeightCache,
             sites: bool) -> tuple[Optional[EmulatedArm], str]:
    """One emulated arm; on failure None and the error (the exception, and with it every tensor
    its frames held, is gone when this returns, before anything else runs)."""
    try:
        return emulate_rank(arm, rank, sink.append, weights=cache, sites=sites), ""
    except Exception as exc:  # one arm failing (e.g. out of memory) must not lose the others
        traceback.print_exc()
        peak = torch.cuda.max_memory_allocated() if torch.cuda.is_available() else 0
        return None, (f"{type(exc).__name__}: {exc}".splitlines()[0][:400]
                      + f" (peak allocated {peak / MiB:.0f} MiB)")


def _probe(recs: list[StepRecord]) -> Any:
    return next((r.memory_probe for r in recs if r.memory_probe is not None), None)


def _stats(recs: list[StepRecord]) -> Any:
    return next((r.graph_stats for r in recs if r.graph_stats is not None), None)


def summarize(case: Case, run: RankRun, top: int) -> dict[str, Any]:
    """The figures and checks of one emulated rank (see the module docstring)."""
    fixed = arm_names(case)[2]
    rec = run.records
    s: dict[str, Any] = {"rank": run.rank, "label": run.label, "errors": run.errors, "skipped": run.skipped,
                         "checks": {}}
    checks = s["checks"]
    gib = run.param_bytes / 2**30
    s["static_gib"] = {"params": gib, "grads": gib, "adam_moments": 2 * gib, "total": 4 * gib}
    every = [r for rs in rec.values() for r in rs]
    checks["no_nan_or_skipped"] = bool(every) and not any(r.nan or r.skipped for r in every)
    s["nan_or_skipped_steps"] = {arm: [r.step for r in rs if r.nan or r.skipped] for arm, rs in rec.items()
                                 if any(r.nan or r.skipped for r in rs)}
    g, e = rec.get(GRAPH, []), rec.get(arm_names(case)[0], [])
    if g and e:
        pairs = list(zip(g, e))
        same = [all(getattr(a, k) == getattr(b, k) for k in ("loss", "aux_loss", "grad_norm")) for a, b in pairs]
        s["bitwise_steps"] = f"{sum(same)}/{len(pairs)}"
        first_bad = next((a.step for a, ok in zip(g, same) if not ok), None)
        s["first_mismatch_step"] = first_bad
        checks["graph_vs_eager_bitwise"] = all(same) and len(g) == len(e) == case.train.steps
        frames: dict[tuple[int, int], int] = {}
        for r in g:
            for f in r.replays:
                frames[(f.cp_size, f.slot)] = frames.get((f.cp_size, f.slot), 0) + f.replays
        s["replays"] = {f"cp{c}/slot{k}": n for (c, k), n in sorted(frames.items())}
        s["replayed_cp_sizes"] = sorted({c for c, _ in frames})
        s["graphed_steps"] = sum(1 for r in g if r.graphed)
        checks["every_cp_size_replayed"] = s["replayed_cp_sizes"] == list(case.layout.cp_sizes)
        st = _stats(g)
        if st is not None:
            s["capture"] = st.summary
            s["pool_mib"] = st.pool_reserved_bytes / MiB
            s["arena_mib"] = st.arena_bytes / MiB
            s["graphs"] = st.graphs
            s["capture_s"] = st.capture_s
        times = [r.step_time_s for r in g if r.graphed and r.step_time_s is not None]
        etimes = [r.step_time_s for r in e[1:] if r.step_time_s is not None]
        s["step_s_graph"] = statistics.median(times) if times else None
        s["step_s_eager"] = statistics.median(etimes) if etimes else None
        s["microbatches"] = [r.microbatches for r in g]
        s["peak_allocated_mib"] = max((r.max_allocated_bytes or 0) for r in g + e) / MiB
    sep = _stats(rec.get(SEPARATE, []))
    shared = _stats(g) if g else None
    if sep is not None and shared is not None and sep.largest_pool_bytes:
        s["shared_over_largest"] = shared.pool_reserved_bytes / sep.largest_pool_bytes
        s["separate_over_largest"] = sep.pool_reserved_bytes / sep.largest_pool_bytes
        s["separate_pools_mib"] = [sep.pool_reserved_bytes / MiB, sep.largest_pool_bytes / MiB]
        bound = case.compare.graph_pools.max_ratio if case.compare.graph_pools else 1.05
        checks[f"shared_pool_at_most_{bound}x_largest"] = s["shared_over_largest"] <= bound
    pg, pf = _probe(g), _probe(rec.get(fixed, []))
    if pg is not None and pf is not None:
        d = pg.device_used_bytes - pf.device_used_bytes
        s["memory"] = {
            "probe_step": case.train.memory_probe_step or case.train.steps,
            "device_used_mib": [pg.device_used_bytes / MiB, pf.device_used_bytes / MiB],
            "device_total_mib": pg.device_total_bytes / MiB,
            "device_delta_mib": d / MiB,
            "device_delta_pct_of_device": 100.0 * d / pg.device_total_bytes,
            "active_delta_mib": (pg.active_bytes - pf.active_bytes) / MiB,
            "reserved_delta_mib": (pg.reserved_bytes - pf.reserved_bytes) / MiB,
            "baseline_device_used_mib": [a.baseline_device_used_bytes / MiB if a.baseline_device_used_bytes else None
                                         for a in (run.arms.get(GRAPH), run.arms.get(fixed)) if a is not None],
        }
    ag, af = run.arms.get(GRAPH), run.arms.get(fixed)
    if ag is not None and af is not None and ag.sites is not None and af.sites is not None:
        tg, tf = pool_totals(ag.sites), pool_totals(af.sites)
        s["by_pool_mib"] = {f"{p} {st}": [tg.get((p, st), 0) / MiB, tf.get((p, st), 0) / MiB]
                            for (p, st) in sorted(set(tg) | set(tf))}
        s["site_diff"] = [asdict(r) | {"delta": r.delta} for r in diff_sites(ag.sites, af.sites, top=top)]
    s["passed"] = bool(checks) and all(checks.values()) and not run.errors
    return s


def _f(v: Any, fmt: str = "{:+.0f}") -> str:
    return "-" if v is None else fmt.format(v)


def table(case: Case, summaries: list[dict[str, Any]], device: str) -> str:
    """The markdown table: TE #3353's validation beside every emulated rank."""
    fixed = arm_names(case)[2]
    head = ["figure", f"TE #3353 ({TE['layout']})"] + [s["label"] for s in summaries]
    rows: list[list[str]] = []

    def row(name: str, te: str, key: Any) -> None:
        rows.append([name, te] + [key(s) for s in summaries])

    mem = lambda s, k, fmt="{:+.0f}": _f(s.get("memory", {}).get(k), fmt)  # noqa: E731
    row("capture line", TE["capture"], lambda s: s.get("capture", "-"))
    row("graph vs eager (loss, aux, grad norm)", TE["graph_vs_eager"],
        lambda s: f"bitwise {s.get('bitwise_steps', '-')} steps" + (
            "" if s.get("first_mismatch_step") is None else f", first mismatch step {s['first_mismatch_step']}"))
    row("NaN / skipped steps", "none", lambda s: "none" if s["checks"].get("no_nan_or_skipped") else
        "; ".join(f"{arm} {steps}" for arm, steps in s.get("nan_or_skipped_steps", {}).items()) or "no steps")
    row("CP sizes replayed (graphed steps)", "CP1 and CP2",
        lambda s: f"{s.get('replayed_cp_sizes', '-')} over {s.get('graphed_steps', '-')} steps")
    row("forward replays per (CP, slot)", "-",
        lambda s: " ".join(f"{k}:{v}" for k, v in s.get("replays", {}).items()) or "-")
    row("graph pool / arenas MiB", "-", lambda s: f"{_f(s.get('pool_mib'), '{:.0f}')} / {_f(s.get('arena_mib'), '{:.0f}')}")
    row("slot-shared pool / largest variant", TE["pool_ratio"], lambda s: _f(s.get("shared_over_largest"), "{:.4f}"))
    row("separate pools / largest", "-", lambda s: _f(s.get("separate_over_largest"), "{:.4f}"))
    row(f"whole device, DCP+graph vs {fixed} (MiB)", TE["device_delta"], lambda s: mem(s, "device_delta_mib"))
    row("whole device delta, % of device", TE["device_delta_pct"], lambda s: mem(s, "device_delta_pct_of_device", "{:+.4f} %"))
    row("whole device used MiB (DCP / fixed)", "-",
        lambda s: " / ".join(f"{v:.0f}" for v in s.get("memory", {}).get("device_used_mib", [])) or "-")
    row("active delta (MiB)", TE["active_delta"], lambda s: mem(s, "active_delta_mib"))
    row("reserved delta (MiB)", TE["reserved_delta"], lambda s: mem(s, "reserved_delta_mib"))
    row("compute step s (graph / eager, median)", "-",
        lambda s: f"{_f(s.get('step_s_graph'), '{:.3f}')} / {_f(s.get('step_s_eager'), '{:.3f}')}")
    row("peak allocated MiB", "-", lambda s: _f(s.get("peak_allocated_mib"), "{:.0f}"))
    row("params + grads + Adam moments GiB", "-", lambda s: f"{s['static_gib']['total']:.1f}")
    lines = [f"Emulated ranks of `{case.id}` on {device} ({time.strftime('%Y-%m-%d')}); every figure of an "
             "emulated rank is that rank alone, communication stood in for by the loopback layer.", "",
             "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    for s in summaries:
        if s.get("by_pool_mib"):
            lines += ["", f"{s['label']}: live bytes at the memory probe by pool (MiB, DCP+graph / {fixed})",
                      ", ".join(f"{k} {a:.0f} / {b:.0f}" for k, (a, b) in s["by_pool_mib"].items())]
        if s.get("site_diff"):
            lines += ["", f"{s['label']}: allocator snapshot diff, DCP+graph minus {fixed} (largest first)", "",
                      "| pool | state | site | DCP+graph MiB | fixed MiB | delta MiB |", "|---|---|---|---|---|---|"]
            lines += [f"| {d['pool']} | {d['state']} | `{d['site']}` | {d['candidate'] / MiB:.1f} | "
                      f"{d['reference'] / MiB:.1f} | {d['delta'] / MiB:+.1f} |" for d in s["site_diff"]]
        for arm, why in {**s["errors"], **s["skipped"]}.items():
            lines.append(f"{s['label']}: arm {arm}: {why}")
    return "\n".join(lines)


def fit_check(case: Case, rank: int, steps: int, cache: WeightCache) -> dict[str, Any]:
    """Does ``rank`` fit the device? Its eager arm for ``steps`` steps; the peak extrapolated to
    the most forwards this rank's schedule holds at once over every count the case can reach."""
    from harness.slotmem.schedule import warmup_count
    from harness.workload.graphplan import reachable_microbatch_counts

    arm = with_steps(arm_case(case, arm_names(case)[0]), max(steps, case.graphs.warmup_steps + 1))
    lay, place = case.layout, rank_place(case, rank)
    static = 4 * cache.param_bytes(case, rank)
    recs: list[StepRecord] = []
    oom = None
    torch.cuda.reset_peak_memory_stats()
    try:
        emulate_rank(arm, rank, recs.append, weights=cache)
    except torch.cuda.OutOfMemoryError as exc:
        oom = str(exc).splitlines()[0][:300]
    peak = max([r.max_allocated_bytes or 0 for r in recs] + [torch.cuda.max_memory_allocated()])
    total = torch.cuda.mem_get_info()[1]
    ran = [r.microbatches or 0 for r in recs]
    most = case.train.global_batch
    held = lambda m: warmup_count(lay.pp, place.pp_rank, m, lay.vpp, lay.group) + 1  # noqa: E731
    worst = max(held(m) for m in reachable_microbatch_counts(lay.pp, lay.vpp, lay.group, most))
    seen = max((held(m) for m in ran), default=worst)
    predicted = static + (peak - static) * worst / seen if oom is None else None
    fits = oom is None and predicted is not None and predicted < 0.95 * total
    return {"label": place.label(), "fits": fits, "oom": oom, "steps_run": len(recs),
            "microbatches": ran, "peak_mib": peak / MiB, "device_total_mib": total / MiB,
            "params_grads_adam_mib": static / MiB, "activations_peak_mib": (peak - static) / MiB,
            "forwards_held_seen": seen, "forwards_held_worst": worst,
            "predicted_peak_mib": None if predicted is None else predicted / MiB}


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("case", help="a case file (one case; --case-id picks one of a matrix)")
    ap.add_argument("--case-id", default=None)
    ap.add_argument("--ranks", default=None, help="comma-separated global ranks (default: first and last)")
    ap.add_argument("--out", default="results/emulated", help="folder for the step records")
    ap.add_argument("--json", default=None, help="write the summaries here")
    ap.add_argument("--markdown", default=None, help="write the table here")
    ap.add_argument("--deadline-s", type=float, default=float("inf"),
                    help="start no arm after this many seconds (the rest are listed as not run)")
    ap.add_argument("--threads", type=int, default=8, help="CPU threads for the weight initialisation")
    ap.add_argument("--top", type=int, default=10, help="snapshot-diff entries per rank")
    ap.add_argument("--fit-steps", type=int, default=0,
                    help="only check that the first rank fits: its eager arm for this many steps "
                         "(exit 0 fits, 4 does not)")
    args = ap.parse_args(argv)
    t0 = time.monotonic()
    cases = load_cases([args.case])
    if args.case_id is not None:
        cases = [c for c in cases if c.id == args.case_id]
    if len(cases) != 1:
        raise SystemExit(f"{args.case}: pick one case with --case-id (have {[c.id for c in cases]})")
    case = cases[0]
    ranks = [int(x) for x in args.ranks.split(",")] if args.ranks else list(stage_ranks(case))
    for r in ranks:
        rank_place(case, r)
    if not torch.cuda.is_available():
        print("bench/emulated.py needs a CUDA GPU (graph arms)", file=sys.stderr)
        return 2
    device = torch.cuda.get_device_name()
    arms = plan_arms(case)
    cache = WeightCache(threads=args.threads)
    if args.fit_steps:
        fit = fit_check(case, ranks[0], args.fit_steps, cache)
        print(f"[{fit['label']}] fit check: " + dumps(fit, indent=None), flush=True)
        if args.json:
            Path(args.json).write_text(dumps({"case": case.id, "device": device, "fit": fit}) + "\n")
        return 0 if fit["fits"] else 4
    out = Path(args.out)
    deadline = t0 + args.deadline_s
    summaries: list[dict[str, Any]] = []
    with ThreadPoolExecutor(max_workers=1) as pre:
        ahead: Future = pre.submit(cache.prefetch, case, ranks[:1])
        for i, r in enumerate(ranks):
            ahead.result()
            if i + 1 < len(ranks):  # the next rank's weights are made while this one trains
                ahead = pre.submit(cache.prefetch, case, [ranks[i + 1]])
            run = run_rank(case, r, arms, cache, out, deadline)
            cache.drop(case, r)
            summaries.append(summarize(case, run, args.top))
            print(dumps(summaries[-1], indent=None), flush=True)
    text = table(case, summaries, device)
    print(text, flush=True)
    if args.json:
        Path(args.json).write_text(dumps({"case": case.id, "device": device, "ranks": summaries,
                                          "te3353": TE, "wall_s": time.monotonic() - t0}) + "\n")
    if args.markdown:
        Path(args.markdown).write_text(text + "\n")
    ran = [s for s in summaries if s["checks"]]
    if not ran:
        return 2
    return 0 if all(s["passed"] for s in ran) else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except SystemExit:
        raise
    except BaseException:  # a crash is 3, not a failed check (1)
        traceback.print_exc()
        sys.exit(3)
