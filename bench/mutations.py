"""Mutation table: does the focused suite's verdict catch realistic workload faults?

Each fault is ONE textual patch of one workload line, applied alone to a temporary copy of the
repository's tracked files (never to this checkout, and no fault flag in production code). In the
copy, ``dcp-harness run cases/focused --out OUT`` and ``dcp-harness gate OUT`` run with PYTHONPATH
pointing at the copy; every fault must make the gate exit 1 (a regression), never 0 (missed) or
2 (an error), or stop the run at preflight (exit 2) naming a broken invariant of the harness's own
code (``dcp-harness bug: invariant ...``: a packer fault found before any arm runs, blamed on the
harness, not on the case). The ``dead-model`` row runs no workload patch but a copy of ``tiny-moe-eager`` with
``lr: 1.0e+6`` (the model collapses after one step) and must fail too.

GPU rows (``--gpu``, on a CUDA machine): faults in the static-shape path that both arms of a graph
case share (the static cu_seqlens / masking, the RoPE positions of the static metadata, the static
MoE dispatch), each run against the one-GPU graph case it reaches
(``cases/focused -k gpu1-qwen3-graphs.scope-...``). ``graph_vs_eager`` stays bitwise equal under
them (both arms share the fault); the case's own verdict must still fail, through its reference
arm (the dynamic-shape path on one rank) and its golden values. The copy's graph case runs without
its resume pair (both of its arms share the fault too) and, with ``--jobs`` > 1, without the golden
step time and memory (rows sharing a GPU move both): ``trim_gpu_case``. Prints a Markdown table::

    python bench/mutations.py                 # the CPU rows (a few minutes each on 2 cores)
    python bench/mutations.py --only ep-dispatch --keep
    python bench/mutations.py --gpu --jobs 3  # the GPU rows, three at once on one GPU
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parents[1]
CLI = "import sys; from harness.cli import main; sys.exit(main())"


@dataclass(frozen=True)
class Mutation:
    name: str
    file: str  # relative to the repository root
    description: str
    old: str  # the exact line (must occur once)
    new: str
    select: Optional[str] = None  # `-k` of the cases it runs against (None: all of cases/focused)
    gpu: bool = False  # needs a CUDA GPU (a graph case)
    # A second line patched with the fault, (file, old, new): a case whose setting puts the fault
    # where one guard alone can see it
    also: Optional[tuple[str, str, str]] = None


MUTATIONS: tuple[Mutation, ...] = (
    Mutation("cp-causality", "harness/workload/attention.py",
             "CP chunk queries use top-left instead of bottom-right causal alignment (a later "
             "CP chunk sees the wrong key prefix)",
             "            mask = causal_lower_right(g.q_len, g.k_len)",
             "            mask = torch.nn.attention.bias.causal_upper_left(g.q_len, g.k_len)"),
    Mutation("rope-cp-offset", "harness/workload/attention.py",
             "RoPE of the queries counts positions from the rank's first token (wrong offset on "
             "every CP rank but the first)",
             "        q = rope(q, ctx.positions, self.theta)",
             "        q = rope(q, ctx.positions - ctx.positions[:1], self.theta)"),
    Mutation("grad-averaging", "harness/workload/optim.py",
             "gradients averaged instead of summed over DP x CP / expert-DP (the loss is already "
             "a global per-token mean)",
             "        g.copy_(flat[offset : offset + n].view_as(g))",
             "        g.copy_(flat[offset : offset + n].view_as(g) / handle.size)"),
    Mutation("aux-loss-scaling", "harness/workload/moe.py",
             "aux-loss gradient not scaled by the unit's token share T/N",
             "            y = _AuxLossInjector.apply(y, aux_local, self.coeff * weight)",
             "            y = _AuxLossInjector.apply(y, aux_local, self.coeff)"),
    Mutation("dcp-packing", "harness/workload/packing.py",
             "dynamic-CP packer drops one waiting sequence per microbatch",
             "        remaining = left",
             "        remaining = left[1:]"),
    Mutation("ep-dispatch", "harness/workload/ep.py",
             "EP: received rows not regrouped by local expert before the expert GEMMs",
             "    out_local = experts(got[regroup], recv_counts.sum(dim=0).tolist())",
             "    out_local = experts(got, recv_counts.sum(dim=0).tolist())"),
    # Paths only the issue-19 cases run on CPU: the static-shape path eagerly (shapes: static),
    # expert-DP > 1, the packer's split-off, train.microbatches (each row runs the cases it reaches).
    Mutation("static-cu-seqlens-cpu", "harness/workload/static.py",
             "static metadata: cu_seqlens of a CP1 microbatch lose the boundaries between packed "
             "sequences (the GPU row's fault, on the CPU static cases)",
             "        cu = _cu(list(lengths) + [t - off], max_seqs)",
             "        cu = _cu([sum(lengths), t - off], max_seqs)", select="static"),
    Mutation("static-cp2-key-offsets", "harness/workload/static.py",
             "static metadata of a CP2 rank: each sequence's key prefix one key short (an "
             "off-by-one in the varlen calls' cu_seqlens)",
             "            klen = (j + 1) * ch",
             "            klen = (j + 1) * ch - 1", select="static"),
    Mutation("static-rope-positions-cpu", "harness/workload/attention.py",
             "static attention: RoPE takes the buffer row as position (the GPU row's fault, on "
             "the CPU static cases)",
             "        positions = meta[0]",
             "        positions = torch.arange(t, device=x.device)", select="static"),
    Mutation("static-moe-dispatch-cpu", "harness/workload/ep.py",
             "static MoE (grouped dispatch): rows not sorted into expert order (the GPU row's "
             "fault, on the CPU static cases)",
             "    rows = x[order // k]",
             "    rows = x[torch.arange(t * k, device=x.device) // k]", select="static"),
    Mutation("expert-dp-reduction", "harness/workload/train.py",
             "expert gradients not reduced over expert-DP (EP smaller than the DP x CP pool)",
             "    all_reduce_grads(s.expert, s.groups.expert_dp)",
             "    pass  # expert grads left unreduced over expert-DP", select="edp2"),
    Mutation("grad-norm-expert-dp", "harness/workload/train.py",
             "grad norm counts every expert once per expert-DP rank instead of once",
             "        s.dense, s.expert, alone or pool_rank == 0, alone or pool_rank < case.parallel.ep,",
             "        s.dense, s.expert, alone or pool_rank == 0, True,",
             select="edp2"),
    Mutation("split-off-duplicates", "harness/workload/packing.py",
             "dynamic-CP packer: a sequence split off to idle ranks is also left in its donor "
             "group (trained twice)",
             "            donor[1].remove(seq)",
             "            pass  # the split-off sequence stays in its donor too", select="edp2"),
    Mutation("packer-ignores-microbatches", "harness/workload/packing.py",
             "fixed-CP packer ignores train.microbatches (derives its own count; issue 19's "
             "6/4/4/6/6/4 vs 5/4/3/6/5/3)",
             "    fixed = case.train.microbatches",
             "    fixed = None", select="pp2-vpp2"),
    # Issue 31's second guards, each with the fault the guard it adds was missing for.
    Mutation("checkpoint-step-metadata", "harness/workload/train.py",
             "a checkpoint records the step before the one it holds (its own metadata says K-1 "
             "while its file name says K): the resumed arm trains on as before, but the "
             "checkpoint it loaded is not of the step it resumed after (caught by resume's "
             "loaded_checkpoint only: resumed_after reads the ranks' agreed file name, and the "
             "weights are right)",
             "        **record_json(ckpt.CheckpointMeta(step, case.id, rank, s.layout.world)),",
             "        **record_json(ckpt.CheckpointMeta(step - 1, case.id, rank, s.layout.world)),",
             select="tiny-moe-eager"),
    Mutation("packer-forgets-cp-padding", "harness/workload/packing.py",
             "dynamic-CP packer counts real tokens against cp x max_seqlen_per_rank, forgetting "
             "the 2 x cp padding the batch adds (CP2 groups of 126-128 real tokens, 132 padded, "
             "above 128): dcp.packing on padded tokens catches it, the real-token check did not",
             "from harness.spec.layout import padded_length",
             "padded_length = lambda length, cp: length  # noqa: E731 (the fault: no CP padding)",
             select="tiny-dcp12-vs-cp2"),
    Mutation("cp-contiguous-split", "harness/workload/batch.py",
             "CP ranks hold contiguous slices of each sequence instead of the load-balanced chunks "
             "r and 2cp-1-r: still correct (every position once, the causal mask by position), "
             "but the last rank gets most of the causal work (<arm>.cp_balance; the reference pair "
             "passes; the bitwise CPU golden values see the other rounding too)",
             "            pos = torch.cat([torch.arange(lo, lo + chunk), torch.arange(hi, hi + chunk)])",
             "            pos = torch.arange(2 * cp_rank * chunk, (2 * cp_rank + 2) * chunk)",
             select="tiny-dcp12-vs-cp2"),
    Mutation("optimizer-state-not-restored", "harness/workload/train.py",
             "the resumed process restores the weights but not the optimizer state (Adam starts "
             "over), in tiny-moe-eager stopped after step 11 of 12: step 12's loss and grad norm "
             "come before the optimizer step the lost moments change, so the resume pair's "
             "series pass (caught by resume / optimizer_state only)",
             '    opt.load_state_dict(state["optimizer"])',
             "    pass  # the optimizer state is not restored",
             select="tiny-moe-eager",
             also=("cases/focused/tiny-moe-eager.yaml", "  resume: {}", "  resume: {at_step: 11}")),
    # Issue 41's second guards, each with the fault only the guard it adds catches.
    Mutation("loss-reduced-to-rank0", "harness/workload/train.py",
             "the step's loss and aux-loss sums reach rank 0 alone (a reduce to rank 0 where an "
             "all-reduce belongs): every other rank records its own share while rank 0, the "
             "rank every pair and the golden values read, stays right (caught by "
             "<arm>.ranks_agree only)",
             "    all_reduce_(sums, s.groups.world)",
             "    reduced = all_reduce_(sums.clone(), s.groups.world); "
             "sums = reduced if s.groups.world.rank == 0 else sums",
             select="tiny-dcp12-vs-cp2"),
    # The oracle (compare.oracle): faults in code every arm runs, seeded where only it judges
    # them (the oracle case has no golden values and no pair of arms: every arm would share them).
    Mutation("norm-weight-offset", "harness/workload/norm.py",
             "RMSNorm scales by 1 + weight (Gemma's form) instead of weight (Qwen's)",
             "        return (y * self.weight.float()).to(x.dtype)",
             "        return (y * (1.0 + self.weight.float())).to(x.dtype)", select="tiny-moe-oracle"),
    Mutation("rope-rotation-sign", "harness/workload/attention.py",
             "RoPE rotates the other way (rotate-half with the signs swapped): every relative "
             "position mirrored",
             "    rotated = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)",
             "    rotated = torch.cat([xf[..., half:], -xf[..., :half]], dim=-1)",
             select="tiny-moe-oracle"),
    Mutation("moe-topk-not-renormalised", "harness/workload/moe.py",
             "the top-k router weights are not renormalised to sum to 1 (Qwen3-MoE's "
             "norm_topk_prob)",
             "            y = dispatch_and_compute(x, top_i, weights.to(x.dtype), self.experts, e, ctx.ep,",
             "            y = dispatch_and_compute(x, top_i, top_p.to(x.dtype), self.experts, e, ctx.ep,",
             select="tiny-moe-oracle"),
    Mutation("aux-loss-without-topk", "harness/workload/moe.py",
             "the load-balancing loss is not divided by top-k (E / T^2 instead of E / (T^2 k))",
             "        aux_local = (prob_sum * counts).sum() * (e / (unit * unit * k))",
             "        aux_local = (prob_sum * counts).sum() * (e / (unit * unit))",
             select="tiny-moe-oracle"),
    Mutation("grad-norm-squared", "harness/workload/optim.py",
             "the global grad norm is reported (and clipped by) without its square root",
             "    return math.sqrt(float(sq)) if math.isfinite(float(sq)) else float(\"nan\")",
             "    return float(sq) if math.isfinite(float(sq)) else float(\"nan\")",
             select="tiny-moe-oracle"),
    Mutation("adam-betas-swapped", "harness/workload/optim.py",
             "the optimizer gets (beta2, beta1) for (beta1, beta2) (the first step is the same: "
             "Adam's bias correction cancels the betas there)",
             "    return cls([g for g in groups if g[\"params\"]], lr=train.lr, betas=(o.beta1, o.beta2),",
             "    return cls([g for g in groups if g[\"params\"]], lr=train.lr, betas=(o.beta2, o.beta1),",
             select="tiny-moe-oracle"),
    # The static-shape path both arms of a graph case share (graph_vs_eager cannot see these).
    Mutation("static-cu-seqlens", "harness/workload/static.py",
             "static metadata: cu_seqlens of a CP1 microbatch lose the boundaries between packed "
             "sequences (attention crosses sequences)",
             "        cu = _cu(list(lengths) + [t - off], max_seqs)",
             "        cu = _cu([sum(lengths), t - off], max_seqs)",
             select="gpu1-qwen3-graphs.scope-attn", gpu=True),
    # (Not a GPU row: static-rope-positions-cpu's fault, RoPE positions that run on across packed
    # sequences. At CP1, the GPU case's, each sequence attends only to itself and RoPE depends
    # only on q - k, so it is equivalent up to rounding: 7.6e-6 vs the reference on an H200,
    # inside the pair's noise of 6.3e-6 x 10 (bench/RESULTS-log.md, 2026-12-02). At CP2, where the
    # CPU row runs it, a rank's rows are not its positions and the gathered keys are rotated
    # wrongly: a real fault there.)
    # Measured on an H200 (bench/RESULTS-log.md, 2026-12-03): caught by the golden values (loss
    # 5.3e-5 against 1e-5, aux 1.9e-5, grad norm 1.05e-4 against 1e-4); the reference pair sees
    # 5.0e-5 against its 7e-5 (the fault is 8x its noise, the bound 11x): golden catches it.
    Mutation("static-rope-key-offset", "harness/workload/attention.py",
             "static attention: keys rotated one position ahead of the queries (an off-by-one in "
             "the RoPE positions of the keys: every relative distance is off by one)",
             "        k = rope(k, positions, self.theta)",
             "        k = rope(k, positions + 1, self.theta)",
             select="gpu1-qwen3-graphs.scope-attn", gpu=True),
    Mutation("static-moe-dispatch", "harness/workload/ep.py",
             "static MoE (grouped GEMM): token rows are not sorted into expert order before the "
             "grouped GEMMs (each expert computes other tokens' rows)",
             "    rows = x[order // k]",
             "    rows = x[torch.arange(t * k, device=x.device) // k]",
             select="gpu1-qwen3-graphs.scope-full", gpu=True),
)
DEAD = "dead-model"


# Folders of a checkout that are not part of the repository (a copy without git skips them).
_NOT_SOURCE = {".git", ".venv", "results", "gpu-logs", "__pycache__", ".pytest_cache"}


def repo_files() -> list[str]:
    """The tracked files of this checkout; where it is no git checkout (a copy on a GPU
    machine), every file outside the folders of :data:`_NOT_SOURCE`."""
    listed = subprocess.run(["git", "-C", str(REPO), "ls-files", "-z"], capture_output=True)
    if listed.returncode == 0 and listed.stdout:
        return [f for f in listed.stdout.decode().split("\0") if f]
    out = []
    for path in sorted(REPO.rglob("*")):
        rel = path.relative_to(REPO)
        if path.is_file() and not _NOT_SOURCE & set(rel.parts):
            out.append(rel.as_posix())
    return out


def copy_repo(dest: Path) -> None:
    """The repository's files (as they are in the working tree) into ``dest``."""
    for rel in repo_files():
        src = REPO / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def apply(root: Path, m: Mutation) -> None:
    for file, old, new in [(m.file, m.old, m.new)] + ([m.also] if m.also else []):
        path = root / file
        lines = path.read_text().split("\n")
        hits = [i for i, line in enumerate(lines) if line == old]
        if len(hits) != 1:
            raise SystemExit(f"{m.name}: expected the line once in {file}, found it {len(hits)} "
                             "times")
        lines[hits[0]] = new
        path.write_text("\n".join(lines))


def dead_model_case(root: Path) -> str:
    """A copy of tiny-moe-eager with lr 1e6 in its own folder; returns the folder to run."""
    src = (root / "cases/focused/tiny-moe-eager.yaml").read_text()
    text = re.sub(r"(?m)^name: tiny-moe-eager$", "name: dead-model-lr1e6", src)
    text = re.sub(r"(?m)^  lr: .*$", "  lr: 1.0e+6", text)
    text = re.sub(r"(?m)^  golden: .*\n", "", text)  # no golden values for this copy
    out = root / "cases/dead"
    out.mkdir(parents=True)
    (out / "dead-model-lr1e6.yaml").write_text(text)
    return "cases/dead"


def copy_pythonpath(root: Path) -> str:
    """PYTHONPATH for a process of the copy ``root``: the copy first (its ``harness`` wins over
    this checkout's), then what was already there (e.g. the site folder of wheels installed with
    ``--target`` on a GPU machine without pydantic)."""
    rest = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(root)] + ([rest] if rest else []))


GPU_CASE = "cases/focused/gpu1-qwen3-graphs.yaml"


def trim_gpu_case(root: Path, shared_gpu: bool) -> None:
    """The copy's graph case, cut to the pairs a static-path fault can reach: without its resume
    pair (graph vs graph-resumed: both arms share the fault, and the resumed arm's checkpoint of
    the billion-parameter model is most of a row's time), and, when rows share the GPU
    (``--jobs`` > 1), without the golden step time and memory (a neighbour on the GPU moves both:
    a row failing there says nothing)."""
    path = root / GPU_CASE
    lines = path.read_text().split("\n")
    resume = [i for i, line in enumerate(lines) if line.startswith("  resume: ")]
    golden = [i for i, line in enumerate(lines) if line.startswith("  golden: {}")]
    if len(resume) != 1 or len(golden) != 1:
        raise SystemExit(f"{GPU_CASE}: expected one '  resume: ' and one '  golden: {{}}' line of "
                         f"compare, found {len(resume)} and {len(golden)}")
    if shared_gpu:
        lines[golden[0]] = "  golden: {step_time: null, memory: null}"
    del lines[resume[0]]
    path.write_text("\n".join(lines))


def _cli(root: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": copy_pythonpath(root)}
    return subprocess.run([sys.executable, "-c", CLI, *args], cwd=root, env=env, text=True,
                          capture_output=True, timeout=timeout_s)


def keep_verdicts(sweep: Path, dest: Path) -> None:
    """Each case's ``verdict.json`` of ``sweep`` into ``dest/<case>/`` (the checks' values, for
    reading a row against other bounds after the copy is gone)."""
    for verdict in sweep.glob("*/verdict.json"):
        (dest / verdict.parent.name).mkdir(parents=True, exist_ok=True)
        shutil.copy2(verdict, dest / verdict.parent.name / "verdict.json")


def failed_lines(gate_stdout: str) -> list[str]:
    """The gate's ``FAIL ...`` and ``ERROR ...`` lines (stripped), in their order."""
    return [line.strip() for line in gate_stdout.splitlines()
            if line.strip().startswith(("FAIL ", "ERROR "))]


def run_one(name: str, mutation: Optional[Mutation], keep: bool, timeout_s: float,
            verdicts: Optional[Path] = None, shared_gpu: bool = False) -> dict:
    root = Path(tempfile.mkdtemp(prefix=f"dcp-mutation-{name}-"))
    try:
        copy_repo(root)
        cases = ["cases/focused"]
        if mutation is not None:
            apply(root, mutation)
            if mutation.gpu:
                trim_gpu_case(root, shared_gpu)
            if mutation.select is not None:
                cases += ["-k", mutation.select]
        else:
            cases = [dead_model_case(root)]
        out = root / "results" / name
        t0 = time.monotonic()
        ran = _cli(root, "run", *cases, "--out", str(out), "--label", "drill", timeout_s=timeout_s)
        bug = preflight_bug(ran.stderr)
        if bug is not None:  # stopped before any arm ran: the harness's own invariant broke
            return {"name": name, "run": ran.returncode, "gate": None, "preflight": bug,
                    "wall_s": time.monotonic() - t0, "failed": [f"PREFLIGHT {bug}"], "tail": ""}
        gate = _cli(root, "gate", str(out), timeout_s=120)
        failed = failed_lines(gate.stdout)
        if verdicts is not None:
            keep_verdicts(out, verdicts / name)
        return {"name": name, "run": ran.returncode, "gate": gate.returncode,
                "wall_s": time.monotonic() - t0, "failed": failed,
                "tail": (ran.stdout + ran.stderr)[-2000:] if ran.returncode not in (0, 1) else ""}
    finally:
        if keep:
            print(f"kept {root}", file=sys.stderr)
        else:
            shutil.rmtree(root, ignore_errors=True)


def preflight_bug(stderr: str) -> Optional[str]:
    """The invariant a run's preflight named as broken (``dcp-harness bug: invariant '...'``: the
    packer broke its own rule before any arm ran), else None."""
    match = re.search(r"dcp-harness bug: invariant '([^']+)'", stderr)
    return match.group(1) if match else None


def caught(r: dict) -> bool:
    """A row is caught when the gate exits 1 (a regression), or when preflight stopped the run
    with exit 2 naming one of the harness's own invariants (a packer fault found before any arm
    ran, blamed on the harness: ``workload.datacheck``)."""
    if r.get("preflight"):
        return r["run"] == 2
    return r["gate"] == 1 and r["run"] == 1


def _checks(failed: list[str]) -> str:
    """``case / pair: checks`` of each failed entry, shortened for the table."""
    parts = []
    for line in failed:
        kind, _, rest = line.partition(" ")
        parts.append(f"{kind} {rest.strip()}".replace("|", "/"))
    return "<br>".join(parts) or "-"


def main(argv: Optional[list[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", action="append", default=None, metavar="NAME",
                    help=f"run only these rows ({', '.join([m.name for m in MUTATIONS] + [DEAD])})")
    ap.add_argument("--keep", action="store_true", help="keep the temporary copies")
    ap.add_argument("--timeout-s", type=float, default=1200.0, help="limit of one focused run")
    ap.add_argument("--gpu", action="store_true",
                    help="the GPU rows (faults in the static path of the graph cases; needs CUDA) "
                         "instead of the CPU rows")
    ap.add_argument("--verdicts", type=Path, default=None, metavar="DIR",
                    help="keep each row's verdicts in DIR/<row>/<case>/verdict.json")
    ap.add_argument("--jobs", type=int, default=1, metavar="N",
                    help="rows run at once (each in its own copy; GPU rows share the GPU)")
    args = ap.parse_args(argv)
    every: list[tuple[str, Optional[Mutation]]] = [(m.name, m) for m in MUTATIONS] + [(DEAD, None)]
    if args.only:
        unknown = set(args.only) - {n for n, _ in every}
        if unknown:
            ap.error(f"unknown row(s): {', '.join(sorted(unknown))}")
        rows = [(n, m) for n, m in every if n in args.only]
    else:
        rows = [(n, m) for n, m in every if (m is not None and m.gpu) == args.gpu]
    if args.jobs < 1:
        ap.error("--jobs must be >= 1")
    if any(m is not None and m.gpu for _, m in rows):
        import torch

        if not torch.cuda.is_available():
            ap.error("the GPU rows run the graph cases, which need a CUDA GPU (none here)")
    print("| fault | file | cases | description | run exit | gate exit | failed entries: checks "
          "| wall s |")
    print("|---|---|---|---|---|---|---|---|")
    bad = 0
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:  # each row: its own copy, processes
        futures = [pool.submit(run_one, name, m, args.keep, args.timeout_s, args.verdicts,
                               args.jobs > 1) for name, m in rows]
        for (name, m), future in zip(rows, futures):
            r = future.result()
            where = m.file if m else "cases (copy of tiny-moe-eager)"
            cases = (f"-k {m.select}" if m and m.select else "cases/focused" if m
                     else "dead-model-lr1e6")
            what = m.description if m else "train.lr 1.0e+6: the model collapses after one step"
            print(f"| {name} | {where} | {cases} | {what} | {r['run']} | {'-' if r['gate'] is None else r['gate']} | "
                  f"{_checks(r['failed'])} | {r['wall_s']:.0f} |", flush=True)
            if not caught(r):
                bad += 1
                if r["tail"]:
                    print(f"<!-- {name} output tail:\n{r['tail']}\n-->", flush=True)
    print(f"\n{len(rows) - bad} of {len(rows)} rows caught (gate exit 1, or preflight exit 2 "
          "naming a broken harness invariant)")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
