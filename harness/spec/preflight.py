"""Preflight: layout and shape checks that need no GPU, run on every case before anything starts.

Each check is a pure function ``Case -> list[Problem]``; :func:`preflight` runs them all. Every
problem names the field to change. Rules (``world = resources.nodes * resources.gpus_per_node``,
``dp_cp = world / pp``, the DP x CP ranks of one pipeline stage):

* Layout. Fixed CP: ``world`` divisible by ``pp * cp`` (so ``world = pp * dp * cp``). Dynamic CP:
  ``world`` divisible by ``pp``; every ``dynamic_cp`` size a power of two dividing ``dp_cp``.
  ``vpp > 1`` needs ``pp > 1`` (Megatron's interleaved schedule).
* ``model.layers`` divisible by ``pp * vpp``.
* ``model.experts`` divisible by ``ep``; ``ep`` divides ``dp_cp``; ``experts_per_token <= experts``.
* ``model.heads`` divisible by ``kv_heads``; ``head_dim`` even (RoPE rotates pairs).
* Sequences. Fixed CP with ``cp > 1``: ``seq_length % (2 * cp) == 0`` (load-balanced causal split
  into 2*cp chunks; Megatron asserts it only when CP is on). Dynamic CP: ``max_seqlen_per_rank``
  given, even, and ``max_seqlen_per_rank * max(dynamic_cp) >= seq_length``. Fixed CP must not set
  ``max_seqlen_per_rank`` (it would be silently unused). ``data.lengths.max <= seq_length``.
* ``train.global_batch``: fixed CP, divisible by ``dp``; dynamic CP, at least ``dp_cp`` (no rank
  of the pool may be left without data).
* Microbatches (Megatron ``schedules.py`` rules, ``group = parallel.microbatch_group or pp``):
  with ``vpp > 1`` the group must be ``>= pp``. When ``train.microbatches = M`` is given:
  ``M >= pp`` when ``pp > 1``; with ``vpp > 1`` also ``group <= M`` and ``M % group`` is 0 or
  ``>= pp`` (Megatron lets the last group be short as long as it still fills the pipeline, so M
  need not be a multiple of the group); with fixed CP ``M <= global_batch / dp`` (one sequence at
  least per microbatch). ``microbatch_group`` is ignored when ``vpp == 1`` (as in Megatron).
* Microbatch fill (:func:`check_microbatch_fill`). The runtime's packing (``workload.packing``)
  imports torch, so the bound is derived here; the count rule is the schedule's own
  ``slotmem.schedule.microbatch_count_problem`` (pure Python, the one place that rule lives; the
  tests check that preflight agrees with ``plan_step`` on fixed lengths). Every microbatch
  holds at least one sequence per DP rank, so a step runs at most ``global_batch / dp`` of them;
  ``accepted(M)`` is the schedule's rule (every ``M >= 1`` without VPP). The smallest accepted count
  must be ``<= global_batch / dp`` (``train.global_batch``; dynamic CP: ``<= global_batch``).
  Fixed CP packs sequences into ``dp * M`` bins of ``seq_length`` real tokens; sequences are at
  least ``shortest`` tokens (``min(lengths.max, seq_length)`` for the ``fixed`` distribution,
  every length is that; else ``min(lengths.min, that)``), so a bin holds at most
  ``seq_length // shortest`` and ``M >= need = ceil(global_batch / (dp * (seq_length //
  shortest)))``. Given ``train.microbatches``, it must be ``>= need``; derived, some accepted
  count must lie in ``[need, global_batch / dp]`` (``data.lengths``), as the runtime takes the
  smallest accepted count that packs. Exact for ``fixed`` lengths (equal sequences pack round
  robin); for random lengths only the certain failures are caught. The fixed-CP arm of
  ``compare.dcp_vs_fixed_cp`` is checked the same way with ``dp = dp_cp / fixed_cp``.
* ``compare.dcp_vs_fixed_cp`` needs ``parallel.dynamic_cp``; its ``fixed_cp`` is a power of two
  dividing ``dp_cp`` and the fixed-CP arm's layout must hold too (``global_batch`` divisible by
  ``dp_cp / fixed_cp``; ``seq_length % (2 * fixed_cp) == 0`` when ``fixed_cp > 1``).
* ``compare.repeat`` with ``loss: exact`` needs ``train.deterministic: true``.
* ``compare.reference`` needs a layout other than the single-rank one it is compared with (more
  than one rank, or PP, CP or EP), or a ``graphs:`` section (its reference runs dynamic shapes);
  ``compare.golden.dir`` is relative (to the case file's folder).
* Graphs (``graphs:``): ``train.max_seqs_per_microbatch`` given (the cu_seqlens capacity; a fixed-CP
  bin then holds at most that many sequences), ``warmup_steps < steps``, scope ``full`` only with
  ``ep == 1``; ``compare.graph_vs_eager`` / ``compare.graph_pools`` need a ``graphs:`` section, and
  ``graph_pools`` two or more dynamic CP sizes. ``train.memory_probe_step <= steps``.
  Whether CUDA is there is decided by the launcher (a case that cannot run here is skipped).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Optional, Sequence

from harness.slotmem.schedule import microbatch_count_problem
from harness.spec.layout import cp_size_problem, is_pow2
from harness.spec.problems import Loc, Problem
from harness.spec.schema import Case


def _at(field: str) -> Loc:
    return tuple(field.split("."))


_pow2 = is_pow2


def _world_text(case: Case) -> str:
    r = case.resources
    return (
        f"world size {case.world_size} (resources.nodes {r.nodes} x "
        f"resources.gpus_per_node {r.gpus_per_node})"
    )


def _layout_ok(case: Case) -> bool:
    """Whether dp/dp_cp are well defined (the checks that use them are skipped otherwise)."""
    p = case.parallel
    if case.world_size % p.pp:
        return False
    if p.is_dynamic:
        return True
    return case.world_size % (p.pp * p.max_cp) == 0


def check_layout(case: Case) -> list[Problem]:
    p = case.parallel
    problems: list[Problem] = []
    if case.world_size % p.pp:
        problems.append(Problem(_at("parallel.pp"),
                                f"pp={p.pp} does not divide the {_world_text(case)}"))
    elif not p.is_dynamic:
        cp = p.max_cp
        if case.world_size % (p.pp * cp):
            problems.append(Problem(
                _at("parallel.cp"),
                f"the {_world_text(case)} is not divisible by pp*cp = {p.pp}*{cp} = "
                f"{p.pp * cp}; world must equal pp*dp*cp"))
    else:
        dp_cp = case.dp_cp
        bad = [s for s in p.cp_sizes if cp_size_problem(s, dp_cp) is not None]
        if bad:
            problems.append(Problem(
                _at("parallel.dynamic_cp"),
                f"CP sizes {bad} must be powers of two dividing the {dp_cp} DP x CP ranks of a "
                f"pipeline stage (world {case.world_size} / pp {p.pp})"))
    if p.vpp > 1 and p.pp == 1:
        problems.append(Problem(_at("parallel.vpp"),
                                f"vpp={p.vpp} needs pp > 1 (interleaved pipeline schedule)"))
    return problems


def check_layers(case: Case) -> list[Problem]:
    p, m = case.parallel, case.model
    if m.layers % (p.pp * p.vpp):
        return [Problem(_at("model.layers"),
                        f"{m.layers} layers cannot be split over pp*vpp = {p.pp}*{p.vpp} = "
                        f"{p.pp * p.vpp} model chunks; use a multiple of {p.pp * p.vpp}")]
    return []


def check_experts(case: Case) -> list[Problem]:
    p, m = case.parallel, case.model
    problems: list[Problem] = []
    if m.experts % p.ep:
        problems.append(Problem(_at("parallel.ep"),
                                f"ep={p.ep} does not divide model.experts={m.experts}"))
    if case.world_size % p.pp == 0 and case.dp_cp % p.ep:
        problems.append(Problem(
            _at("parallel.ep"),
            f"ep={p.ep} does not divide the {case.dp_cp} DP x CP ranks of a pipeline stage "
            f"(world {case.world_size} / pp {p.pp})"))
    if m.experts_per_token > m.experts:
        problems.append(Problem(
            _at("model.experts_per_token"),
            f"{m.experts_per_token} experts per token but only {m.experts} experts"))
    return problems


def check_attention(case: Case) -> list[Problem]:
    m = case.model
    problems: list[Problem] = []
    if m.heads % m.kv_heads:
        problems.append(Problem(_at("model.kv_heads"),
                                f"kv_heads={m.kv_heads} does not divide heads={m.heads} (GQA)"))
    if m.head_dim % 2:
        problems.append(Problem(_at("model.head_dim"),
                                f"head_dim={m.head_dim} must be even (RoPE rotates pairs)"))
    return problems


def check_sequences(case: Case) -> list[Problem]:
    p, t = case.parallel, case.train
    problems: list[Problem] = []
    if p.is_dynamic:
        top = p.max_cp
        if t.max_seqlen_per_rank is None:
            problems.append(Problem(
                _at("train.max_seqlen_per_rank"),
                "dynamic CP needs max_seqlen_per_rank (tokens one rank may hold)"))
        elif t.max_seqlen_per_rank % 2:
            problems.append(Problem(
                _at("train.max_seqlen_per_rank"),
                f"max_seqlen_per_rank={t.max_seqlen_per_rank} must be even"))
        elif t.max_seqlen_per_rank * top < t.seq_length:
            problems.append(Problem(
                _at("train.max_seqlen_per_rank"),
                f"max_seqlen_per_rank {t.max_seqlen_per_rank} x largest CP size {top} = "
                f"{t.max_seqlen_per_rank * top} tokens cannot hold a sequence of "
                f"seq_length {t.seq_length}"))
    else:
        cp = p.max_cp
        if cp > 1 and t.seq_length % (2 * cp):
            problems.append(Problem(
                _at("train.seq_length"),
                f"seq_length {t.seq_length} must be divisible by 2*cp = {2 * cp}"))
        if t.max_seqlen_per_rank is not None:
            problems.append(Problem(
                _at("train.max_seqlen_per_rank"),
                "max_seqlen_per_rank only applies to dynamic CP (parallel.dynamic_cp); "
                "remove it for fixed CP"))
    longest = case.data.lengths.max
    if longest > t.seq_length:
        given = "max" in case.data.lengths.model_fields_set
        problems.append(Problem(
            _at("data.lengths.max"),
            f"longest sequence {longest}{'' if given else ' (the default)'} exceeds "
            f"train.seq_length {t.seq_length}; set data.lengths.max <= {t.seq_length} or raise "
            f"train.seq_length"))
    return problems


def check_batch(case: Case) -> list[Problem]:
    if not _layout_ok(case):
        return []
    t = case.train
    if case.parallel.is_dynamic:
        if t.global_batch < case.dp_cp:
            return [Problem(
                _at("train.global_batch"),
                f"global_batch {t.global_batch} is smaller than the {case.dp_cp} DP x CP ranks "
                f"of a pipeline stage; every rank needs data")]
    elif t.global_batch % case.dp:
        return [Problem(_at("train.global_batch"),
                        f"global_batch {t.global_batch} is not divisible by dp={case.dp}")]
    return []


def check_microbatches(case: Case) -> list[Problem]:
    p, t = case.parallel, case.train
    problems: list[Problem] = []
    group = p.group_size
    if p.vpp > 1 and group < p.pp:
        problems.append(Problem(
            _at("parallel.microbatch_group"),
            f"microbatch group {group} is smaller than pp={p.pp} (interleaved schedule)"))
    m = t.microbatches
    if m is None:
        return problems
    field = _at("train.microbatches")
    if p.pp > 1 and m < p.pp:
        problems.append(Problem(field, f"{m} microbatches cannot fill pp={p.pp} stages; "
                                       f"use at least {p.pp}"))
    why = microbatch_count_problem(p.pp, p.vpp, group, m) if p.vpp > 1 and group >= p.pp else None
    if why is not None:
        problems.append(Problem(field, f"{why} (interleaved schedule); the next count it "
                                       f"accepts is {_first_accepted(case, m, m + group)}"))
    if not p.is_dynamic and _layout_ok(case):
        per_rank = t.global_batch // case.dp
        if m > per_rank:
            problems.append(Problem(
                field,
                f"{m} microbatches but only {per_rank} sequences per DP rank "
                f"(global_batch {t.global_batch} / dp {case.dp})"))
    return problems


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _schedule_text(case: Case) -> str:
    p = case.parallel
    return f"pp={p.pp}, vpp={p.vpp}, microbatch group {p.group_size}"


def _accepts(case: Case) -> Callable[[int], bool]:
    """Whether the case's pipeline schedule runs ``m`` microbatches."""
    p = case.parallel
    return lambda m: microbatch_count_problem(p.pp, p.vpp, p.group_size, m) is None


def _first_accepted(case: Case, low: int, high: int) -> Optional[int]:
    ok = _accepts(case)
    return next((m for m in range(max(low, 1), high + 1) if ok(m)), None)


def _smallest_count(case: Case) -> int:
    """The smallest microbatch count the schedule accepts (the group itself always is)."""
    found = _first_accepted(case, 1, case.parallel.group_size)
    return found if found is not None else case.parallel.group_size


def _shortest(case: Case) -> tuple[int, str]:
    """A lower bound on every sequence's length, and how to describe the sequences."""
    spec, seq_length = case.data.lengths, case.train.seq_length
    longest = min(spec.max, seq_length)
    if spec.distribution == "fixed":
        return longest, f"{longest} tokens each (data.lengths distribution: fixed)"
    shortest = min(spec.min, longest)
    return shortest, f"at least {shortest} tokens (data.lengths.min)"


def _per_bin(case: Case, shortest: int) -> int:
    """Most sequences a fixed-CP bin of ``seq_length`` tokens can hold (at most
    ``train.max_seqs_per_microbatch`` in a graph case, whose metadata buffers are that big)."""
    per_bin = case.train.seq_length // shortest
    cap = case.train.max_seqs_per_microbatch
    return min(per_bin, cap) if cap is not None and case.static_shapes else per_bin


def _fixed_count(case: Case, global_batch: int, dp: int) -> Optional[int]:
    """The derived microbatch count of a fixed-CP step at this global batch (a lower bound unless
    lengths are fixed), or None when no accepted count both packs and fills every bin."""
    per_bin = _per_bin(case, _shortest(case)[0])
    need = _ceil_div(global_batch, dp * per_bin)
    return _first_accepted(case, need, global_batch // dp)


def _working_batches(case: Case, dp: int) -> str:
    """The nearest global batches (multiples of ``dp``) around the case's that would pack."""
    gbs = case.train.global_batch
    below = next((g for g in range(gbs - dp, 0, -dp) if _fixed_count(case, g, dp) is not None),
                 None)
    # dp * k packs for every accepted k (need <= k), and one lies within a group + pp above.
    top = gbs + dp * (case.parallel.group_size + case.parallel.pp + 1)
    above = next(g for g in range(gbs + dp, top, dp) if _fixed_count(case, g, dp) is not None)
    return f"{below} or {above}" if below is not None else f"{above}"


def _fixed_fill(case: Case, dp: int, arm: str) -> list[Problem]:
    """The microbatch-fill rules of a fixed-CP step on ``dp`` DP ranks (see the docstring)."""
    p, t = case.parallel, case.train
    gbs, mbs = t.global_batch, t.microbatches
    if gbs % dp:
        return []
    per_rank = gbs // dp
    smallest = _smallest_count(case)
    shortest, lengths = _shortest(case)
    per_bin = _per_bin(case, shortest)
    need = _ceil_div(gbs, dp * per_bin)
    if mbs is not None and arm and mbs > per_rank:
        return [Problem(_at("train.microbatches"), (
            f"{arm}{mbs} microbatches but only {per_rank} sequences per DP rank (global_batch "
            f"{gbs} / dp {dp}); use at most {per_rank}"))]
    if mbs is not None:
        if mbs >= need or mbs < p.pp or mbs > per_rank or not _accepts(case)(mbs):
            return []  # enough bins, or already reported by check_microbatches
        fit = _first_accepted(case, need, per_rank)
        hint = (f"use train.microbatches: {fit}" if fit is not None else
                f"no count from {need} to {per_rank} is accepted by the schedule "
                f"({_schedule_text(case)}); remove train.microbatches and use "
                f"train.global_batch: {_working_batches(case, dp)}")
        return [Problem(_at("train.microbatches"), (
            f"{arm}{mbs} microbatches x dp {dp} = {mbs * dp} bins of train.seq_length "
            f"{t.seq_length} tokens hold at most {mbs * dp * per_bin} of the {gbs} sequences of "
            f"{lengths}; {hint}"))]
    if per_rank < smallest:
        return [Problem(_at("train.global_batch"), (
            f"{arm}global_batch {gbs} gives {per_rank} sequence(s) per DP rank (dp={dp}) but "
            f"every microbatch needs one and the interleaved schedule ({_schedule_text(case)}) "
            f"needs at least {smallest} microbatches; use train.global_batch >= {dp * smallest}"))]
    if _first_accepted(case, need, per_rank) is None:
        nxt = _first_accepted(case, need, need + p.group_size + p.pp)
        why = microbatch_count_problem(p.pp, p.vpp, p.group_size, need)
        return [Problem(_at("data.lengths"), (
            f"{arm}{gbs} sequences of {lengths} fit {per_bin} per train.seq_length "
            f"{t.seq_length}-token bin, so each of the dp={dp} ranks needs at least {need} "
            f"microbatches; the schedule rejects {need} ({why}) and its next accepted count, "
            f"{nxt}, is more than the {per_rank} sequences per DP rank (every microbatch needs "
            f"one); use train.global_batch: {_working_batches(case, dp)}, or lengths that fit "
            f"more sequences per bin"))]
    return []


def check_microbatch_fill(case: Case) -> list[Problem]:
    p, t = case.parallel, case.train
    if not _layout_ok(case) or (p.vpp > 1 and p.group_size < p.pp):
        return []  # reported by check_layout / check_microbatches
    if not p.is_dynamic:
        return _fixed_fill(case, case.dp, "")
    problems: list[Problem] = []
    smallest = _smallest_count(case)
    if t.global_batch < smallest:
        problems.append(Problem(_at("train.global_batch"), (
            f"global_batch {t.global_batch} cannot make the {smallest} microbatches the "
            f"interleaved schedule ({_schedule_text(case)}) needs at least (every microbatch "
            f"needs a sequence); use train.global_batch >= {max(smallest, case.dp_cp)}")))
    pair = case.compare.dcp_vs_fixed_cp
    if pair is not None and _pow2(pair.fixed_cp) and case.dp_cp % pair.fixed_cp == 0:
        fixed_dp = case.dp_cp // pair.fixed_cp
        arm = (f"the fixed-CP arm (compare.dcp_vs_fixed_cp.fixed_cp {pair.fixed_cp}, "
               f"dp={fixed_dp}): ")
        problems.extend(_fixed_fill(case, fixed_dp, arm))
    return problems


def reference_layout_problem(case: Case) -> Optional[str]:
    """Why ``case`` has no single-rank reference arm distinct from itself (None: it has one). A
    graph case always has one: its reference runs the dynamic-shape eager path, which its static
    arms do not share."""
    p = case.parallel
    if (case.world_size == 1 and p.pp == 1 and p.ep == 1 and p.max_cp == 1 and not p.is_dynamic
            and case.graphs is None):
        return ("the case already runs the single-rank reference layout (1 rank, no PP, CP or "
                "EP): check it against compare.golden values or a compare.repeat instead")
    return None


def check_compare(case: Case) -> list[Problem]:
    p, t, c = case.parallel, case.train, case.compare
    problems: list[Problem] = []
    pair = c.dcp_vs_fixed_cp
    if pair is not None:
        if not p.is_dynamic:
            problems.append(Problem(_at("compare.dcp_vs_fixed_cp"),
                                    "needs parallel.dynamic_cp (a dynamic-CP case)"))
        elif case.world_size % p.pp == 0:
            dp_cp = case.dp_cp
            field = _at("compare.dcp_vs_fixed_cp.fixed_cp")
            why = cp_size_problem(pair.fixed_cp, dp_cp)
            if why is not None:
                problems.append(Problem(field, f"fixed_cp={pair.fixed_cp}: {why}"))
            else:
                fixed_dp = dp_cp // pair.fixed_cp
                if t.global_batch % fixed_dp:
                    problems.append(Problem(
                        field, f"the fixed-CP arm has dp={fixed_dp}, which does not divide "
                               f"train.global_batch {t.global_batch}"))
                if pair.fixed_cp > 1 and t.seq_length % (2 * pair.fixed_cp):
                    problems.append(Problem(
                        field, f"the fixed-CP arm needs train.seq_length {t.seq_length} "
                               f"divisible by 2*fixed_cp = {2 * pair.fixed_cp}"))
    if c.reference is not None:
        why = reference_layout_problem(case)
        if why is not None:
            problems.append(Problem(_at("compare.reference"), why))
    if c.golden is not None and Path(c.golden.dir).is_absolute():
        problems.append(Problem(_at("compare.golden.dir"), (
            f"{c.golden.dir} is absolute; golden files are committed next to the case files, so "
            "give a folder relative to the case file's folder (e.g. golden)")))
    if c.repeat is not None and c.repeat.loss == "exact" and not t.deterministic:
        problems.append(Problem(
            _at("compare.repeat.loss"),
            "an exact repeat needs train.deterministic: true (or give a tolerance)"))
    return problems


def check_graphs(case: Case) -> list[Problem]:
    """Graph cases (static shapes) and the contracts that need graph arms."""
    g, t, c, p = case.graphs, case.train, case.compare, case.parallel
    problems: list[Problem] = []
    if g is None:
        for name in ("graph_vs_eager", "graph_pools"):
            if getattr(c, name) is not None:
                problems.append(Problem(_at(f"compare.{name}"),
                                        "compares CUDA-graph arms: add a `graphs:` section "
                                        "(e.g. graphs: {scope: attn, warmup_steps: 2})"))
        return problems
    if t.max_seqs_per_microbatch is None:
        problems.append(Problem(_at("train.max_seqs_per_microbatch"), (
            "a graph case needs the most sequences one CP group holds in a microbatch (the "
            "capacity of its fixed-size cu_seqlens buffers), e.g. max_seqs_per_microbatch: 16")))
    if t.dtype != "bf16":
        problems.append(Problem(_at("train.dtype"), (
            f"graph cases run flash varlen attention and grouped expert GEMMs, which need "
            f"dtype bf16 (got {t.dtype}); their fp32 fallbacks read offsets on the host and "
            "cannot be captured")))
    if g.warmup_steps >= t.steps:
        problems.append(Problem(_at("graphs.warmup_steps"), (
            f"{g.warmup_steps} eager warmup steps leave none of the {t.steps} train.steps for the "
            "graphs; use fewer warmup steps or more steps")))
    if g.scope == "full" and p.ep > 1:
        problems.append(Problem(_at("graphs.scope"), (
            f"scope full graphs the MoE dispatch too, whose all-to-all sizes with ep={p.ep} depend "
            "on the routing (no fixed-size all-to-all here); use scope: attn, or ep: 1 (grouped "
            "GEMM over device-side expert offsets)")))
    if c.graph_pools is not None and len(p.cp_sizes) < 2:
        problems.append(Problem(_at("compare.graph_pools"), (
            "compares one MemPool for every CP variant with one pool per CP size: needs "
            "parallel.dynamic_cp with two or more sizes")))
    return problems


def check_memory_probe(case: Case) -> list[Problem]:
    step = case.train.memory_probe_step
    if step is not None and step > case.train.steps:
        return [Problem(_at("train.memory_probe_step"),
                        f"step {step} is after the last of the {case.train.steps} train.steps")]
    return []


CHECKS: tuple[Callable[[Case], list[Problem]], ...] = (
    check_layout,
    check_layers,
    check_experts,
    check_attention,
    check_sequences,
    check_batch,
    check_microbatches,
    check_microbatch_fill,
    check_compare,
    check_graphs,
    check_memory_probe,
)


def preflight(case: Case, checks: Optional[Sequence[Callable[[Case], list[Problem]]]] = None
              ) -> list[Problem]:
    """Every problem found in ``case`` (empty when it may run), in check order."""
    found: list[Problem] = []
    for check in checks if checks is not None else CHECKS:
        found.extend(check(case))
    return found
