"""Preflight: layout and shape checks that need no GPU, run on every case before anything starts.

Each check is a pure function ``Case -> list[Problem]``; :func:`preflight` runs them all. Every
problem names the field to change. Rules (``world = resources.nodes * resources.gpus_per_node``,
``dp_cp = world / pp``, the DP x CP ranks of one pipeline stage):

* The parallel layout's own rules (world, CP sizes, VPP and the microbatch group, EP over the pool,
  the sequence multiple ``2 * cp``, ``max_seqlen_per_rank``, the global batch over DP):
  ``Case.layout.problems()``, listed in ``harness.spec.layout``.
* ``model.layers`` divisible by ``pp * vpp``.
* ``model.experts`` divisible by ``ep``; ``experts_per_token <= experts``.
* ``model.heads`` divisible by ``kv_heads``; ``head_dim`` even (RoPE rotates pairs).
* ``data.lengths.max <= seq_length``.
* Microbatches (Megatron ``schedules.py`` rules, ``group = parallel.microbatch_group or pp``).
  When ``train.microbatches = M`` is given:
  ``M >= pp`` when ``pp > 1``; with ``vpp > 1`` also ``group <= M`` and ``M % group`` is 0 or
  ``>= pp`` (Megatron lets the last group be short as long as it still fills the pipeline, so M
  need not be a multiple of the group); with fixed CP ``M <= global_batch / dp`` (one sequence at
  least per microbatch). ``microbatch_group`` is ignored when ``vpp == 1`` (as in Megatron).
* Microbatch fill (:func:`check_microbatch_fill`). The runtime's packing (``workload.packing``)
  imports torch, so the bound is derived here; the count rule is the schedule's own
  (``ParallelLayout.microbatch_count_problem``: ``slotmem.schedule``, pure Python, the one
  place that rule lives; the tests check that preflight agrees with ``plan_step`` on fixed
  lengths). Every microbatch
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
  robin); for random lengths only the certain failures are caught (:func:`fixed_fill`, which a
  comparison with a fixed-CP arm runs on that arm's layout too).
* Each comparison the case's ``compare:`` section sets: its own rules, in its module
  (``harness.compare.contracts.<name>``; :func:`check_comparisons` runs them). An arm's case
  (``harness.spec.derive``) has no ``compare:`` section and passes the other rules here when it
  is derived.
* Static shapes (``Case.static_scope``: a graph case, or ``shapes: {mode: static}``; not both
  sections): ``train.max_seqs_per_microbatch`` given (the cu_seqlens capacity; a fixed-CP bin
  then holds at most that many sequences), scope ``full`` only with ``ep == 1``.
* Graphs (``graphs:``): dtype bf16, ``warmup_steps < steps``. ``train.memory_probe_step <= steps``.
  Whether CUDA is there is decided by the launcher (a case that cannot run here is skipped).
* A command case (``command:``): the layout rules and the comparisons' (each says which of its
  rules apply to a command case, which arm roles it needs and whether a command case may have
  it: ``harness.spec.comparisons.command_problems``), then
  ``harness.spec.command.check_command`` in place of the built-in workload's model,
  microbatch, shape and graph rules (:data:`COMMAND_CHECKS`).
* Emulated ranks (``emulate.ranks``): at least one, each listed once (it records into its own
  ``rank<r>.jsonl``), each a rank of the case's world (it runs as rank r of that world), and a
  world of more than one rank (a one-rank case runs as it is).
"""

from __future__ import annotations

from typing import Callable, Optional, Sequence

from harness.spec.command import check_command
from harness.spec.comparisons import command_problems, sections, settings_of
from harness.spec.layout import ParallelLayout
from harness.spec.problems import Problem
from harness.spec.problems import at as _at
from harness.spec.schema import BaseCase, Case, DType, GraphScope, LengthDistribution


def check_layout(case: BaseCase) -> list[Problem]:
    """The parallel layout's own rules (``harness.spec.layout``)."""
    return case.layout.problems()


def check_layers(case: BaseCase) -> list[Problem]:
    p, m = case.parallel, case.model
    chunks = case.layout.model_chunks
    if m.layers % chunks:
        return [Problem(_at("model.layers"),
                        f"{m.layers} layers cannot be split over pp*vpp = {p.pp}*{p.vpp} = "
                        f"{chunks} model chunks; use a multiple of {chunks}")]
    return []


def check_experts(case: BaseCase) -> list[Problem]:
    p, m = case.parallel, case.model
    problems: list[Problem] = []
    if m.experts % p.ep:
        problems.append(Problem(_at("parallel.ep"),
                                f"ep={p.ep} does not divide model.experts={m.experts}"))
    if m.experts_per_token > m.experts:
        problems.append(Problem(
            _at("model.experts_per_token"),
            f"{m.experts_per_token} experts per token but only {m.experts} experts"))
    return problems


def check_attention(case: BaseCase) -> list[Problem]:
    m = case.model
    problems: list[Problem] = []
    if m.heads % m.kv_heads:
        problems.append(Problem(_at("model.kv_heads"),
                                f"kv_heads={m.kv_heads} does not divide heads={m.heads} (GQA)"))
    if m.head_dim % 2:
        problems.append(Problem(_at("model.head_dim"),
                                f"head_dim={m.head_dim} must be even (RoPE rotates pairs)"))
    return problems


def check_sequences(case: BaseCase) -> list[Problem]:
    t = case.train
    longest = case.data.lengths.max
    if longest > t.seq_length:
        given = "max" in case.data.lengths.model_fields_set
        return [Problem(
            _at("data.lengths.max"),
            f"longest sequence {longest}{'' if given else ' (the default)'} exceeds "
            f"train.seq_length {t.seq_length}; set data.lengths.max <= {t.seq_length} or raise "
            f"train.seq_length")]
    return []


def check_microbatches(case: BaseCase) -> list[Problem]:
    lay, t = case.layout, case.train
    problems: list[Problem] = []
    m = t.microbatches
    if m is None:
        return problems
    field = _at("train.microbatches")
    if lay.pp > 1 and m < lay.pp:
        problems.append(Problem(field, f"{m} microbatches cannot fill pp={lay.pp} stages; "
                                       f"use at least {lay.pp}"))
    why = (lay.microbatch_count_problem(m) if lay.vpp > 1 and lay.group >= lay.pp else None)
    if why is not None:
        problems.append(Problem(field, f"{why} (interleaved schedule); the next count it "
                                       f"accepts is {_first_accepted(lay, m, m + lay.group)}"))
    if not lay.dynamic and lay.exact:
        per_rank = lay.sequences_per_dp_rank
        if m > per_rank:
            problems.append(Problem(
                field,
                f"{m} microbatches but only {per_rank} sequences per DP rank "
                f"(global_batch {t.global_batch} / dp {lay.dp})"))
    return problems


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _schedule_text(lay: ParallelLayout) -> str:
    return f"pp={lay.pp}, vpp={lay.vpp}, microbatch group {lay.group}"


def _first_accepted(lay: ParallelLayout, low: int, high: int) -> Optional[int]:
    """The smallest microbatch count in ``[low, high]`` the pipeline schedule runs."""
    return next((m for m in range(max(low, 1), high + 1)
                 if lay.microbatch_count_problem(m) is None), None)


def _smallest_count(lay: ParallelLayout) -> int:
    """The smallest microbatch count the schedule accepts (the group itself always is)."""
    found = _first_accepted(lay, 1, lay.group)
    return found if found is not None else lay.group


def _shortest(case: BaseCase) -> tuple[int, str]:
    """A lower bound on every sequence's length, and how to describe the sequences."""
    spec, seq_length = case.data.lengths, case.train.seq_length
    longest = min(spec.max, seq_length)
    if spec.distribution is LengthDistribution.FIXED:
        return longest, f"{longest} tokens each (data.lengths distribution: fixed)"
    shortest = min(spec.min, longest)
    return shortest, f"at least {shortest} tokens (data.lengths.min)"


def _per_bin(case: BaseCase, shortest: int) -> int:
    """Most sequences a fixed-CP bin of ``seq_length`` tokens can hold (at most
    ``train.max_seqs_per_microbatch`` in a graph case, whose metadata buffers are that big)."""
    per_bin = case.train.seq_length // shortest
    cap = case.train.max_seqs_per_microbatch
    return min(per_bin, cap) if cap is not None and case.static_shapes else per_bin


def _fixed_count(case: BaseCase, lay: ParallelLayout, global_batch: int) -> Optional[int]:
    """The derived microbatch count of a fixed-CP step at this global batch (a lower bound unless
    lengths are fixed), or None when no accepted count both packs and fills every bin."""
    dp = lay.dp
    per_bin = _per_bin(case, _shortest(case)[0])
    need = _ceil_div(global_batch, dp * per_bin)
    return _first_accepted(lay, need, global_batch // dp)


def _working_batches(case: BaseCase, lay: ParallelLayout) -> str:
    """The nearest global batches (multiples of ``dp``) around the case's that would pack."""
    gbs, dp = case.train.global_batch, lay.dp
    below = next((g for g in range(gbs - dp, 0, -dp) if _fixed_count(case, lay, g) is not None),
                 None)
    # dp * k packs for every accepted k (need <= k), and one lies within a group + pp above.
    top = gbs + dp * (lay.group + lay.pp + 1)
    above = next(g for g in range(gbs + dp, top, dp) if _fixed_count(case, lay, g) is not None)
    return f"{below} or {above}" if below is not None else f"{above}"


def fixed_fill(case: BaseCase, lay: ParallelLayout, arm: str) -> list[Problem]:
    """The microbatch-fill rules of a fixed-CP step of layout ``lay`` (see the docstring);
    ``arm`` names the arm whose layout it is in the messages ('' for the case's own)."""
    t, dp = case.train, lay.dp
    gbs, mbs = t.global_batch, t.microbatches
    if gbs % dp:
        return []
    per_rank = lay.sequences_per_dp_rank
    smallest = _smallest_count(lay)
    shortest, lengths = _shortest(case)
    per_bin = _per_bin(case, shortest)
    need = _ceil_div(gbs, dp * per_bin)
    if mbs is not None and arm and mbs > per_rank:
        return [Problem(_at("train.microbatches"), (
            f"{arm}{mbs} microbatches but only {per_rank} sequences per DP rank (global_batch "
            f"{gbs} / dp {dp}); use at most {per_rank}"))]
    if mbs is not None:
        if (mbs >= need or mbs < lay.pp or mbs > per_rank
                or lay.microbatch_count_problem(mbs) is not None):
            return []  # enough bins, or already reported by check_microbatches
        fit = _first_accepted(lay, need, per_rank)
        hint = (f"use train.microbatches: {fit}" if fit is not None else
                f"no count from {need} to {per_rank} is accepted by the schedule "
                f"({_schedule_text(lay)}); remove train.microbatches and use "
                f"train.global_batch: {_working_batches(case, lay)}")
        return [Problem(_at("train.microbatches"), (
            f"{arm}{mbs} microbatches x dp {dp} = {mbs * dp} bins of train.seq_length "
            f"{t.seq_length} tokens hold at most {mbs * dp * per_bin} of the {gbs} sequences of "
            f"{lengths}; {hint}"))]
    if per_rank < smallest:
        return [Problem(_at("train.global_batch"), (
            f"{arm}global_batch {gbs} gives {per_rank} sequence(s) per DP rank (dp={dp}) but "
            f"every microbatch needs one and the interleaved schedule ({_schedule_text(lay)}) "
            f"needs at least {smallest} microbatches; use train.global_batch >= {dp * smallest}"))]
    if _first_accepted(lay, need, per_rank) is None:
        nxt = _first_accepted(lay, need, need + lay.group + lay.pp)
        why = lay.microbatch_count_problem(need)
        return [Problem(_at("data.lengths"), (
            f"{arm}{gbs} sequences of {lengths} fit {per_bin} per train.seq_length "
            f"{t.seq_length}-token bin, so each of the dp={dp} ranks needs at least {need} "
            f"microbatches; the schedule rejects {need} ({why}) and its next accepted count, "
            f"{nxt}, is more than the {per_rank} sequences per DP rank (every microbatch needs "
            f"one); use train.global_batch: {_working_batches(case, lay)}, or lengths that fit "
            f"more sequences per bin"))]
    return []


def microbatch_fill_applies(case: BaseCase) -> bool:
    """Whether the microbatch-fill rules apply: a layout without problems of its own that
    ``check_layout`` reports (an inexact split, a microbatch group below pp)."""
    lay = case.layout
    return lay.exact and not (lay.vpp > 1 and lay.group < lay.pp)


def check_microbatch_fill(case: BaseCase) -> list[Problem]:
    lay, t = case.layout, case.train
    if not microbatch_fill_applies(case):
        return []  # reported by check_layout
    if not lay.dynamic:
        return fixed_fill(case, lay, "")
    problems: list[Problem] = []
    smallest = _smallest_count(lay)
    if t.global_batch < smallest:
        problems.append(Problem(_at("train.global_batch"), (
            f"global_batch {t.global_batch} cannot make the {smallest} microbatches the "
            f"interleaved schedule ({_schedule_text(lay)}) needs at least (every microbatch "
            f"needs a sequence); use train.global_batch >= {max(smallest, lay.dp_cp)}")))
    return problems


def reference_layout_problem(case: BaseCase) -> Optional[str]:
    """Why ``case`` has no single-rank reference arm distinct from itself (None: it has one). A
    static-shape case (a graph case, or ``shapes: {mode: static}``) always has one: its
    reference runs the dynamic-shape eager path, which its static arms do not share."""
    if case.layout.single_rank and not case.static_shapes:
        return ("the case already runs the single-rank reference layout (1 rank, no PP, CP or "
                "EP): check it against compare.golden values or a compare.repeat instead")
    return None


def check_shapes(case: BaseCase) -> list[Problem]:
    """The static-shape path (a graph case, or ``shapes: {mode: static}``): the metadata
    capacity, scope ``full`` only with ``ep == 1``; ``shapes:`` and ``graphs:`` not both."""
    t, p = case.train, case.parallel
    problems: list[Problem] = []
    if case.graphs is not None and case.shapes is not None:
        problems.append(Problem(_at("shapes"), (
            "a graph case runs static shapes with graphs.scope (graphs: implies them); drop the "
            "shapes section, or drop graphs: to run static shapes without CUDA graphs")))
    scope = case.static_scope
    if scope is None:
        return problems
    what = "a graph case" if case.graphs is not None else "static shapes (shapes.mode: static)"
    where = "graphs.scope" if case.graphs is not None else "shapes.scope"
    if t.max_seqs_per_microbatch is None:
        problems.append(Problem(_at("train.max_seqs_per_microbatch"), (
            f"{what} needs the most sequences one CP group holds in a microbatch (the "
            "capacity of its fixed-size cu_seqlens buffers), e.g. max_seqs_per_microbatch: 16")))
    if scope is GraphScope.FULL and p.ep > 1:
        problems.append(Problem(_at(where), (
            f"scope full runs the static MoE (experts local, grouped GEMM over device-side "
            f"offsets); with ep={p.ep} its all-to-all sizes depend on the routing (no "
            "fixed-size all-to-all here); use scope: attn, or ep: 1")))
    return problems


def check_graphs(case: BaseCase) -> list[Problem]:
    """Graph cases (the static-shape rules they share with ``shapes:`` are
    :func:`check_shapes`')."""
    g, t = case.graphs, case.train
    problems: list[Problem] = []
    if g is None:
        return problems
    if t.dtype is not DType.BF16:
        problems.append(Problem(_at("train.dtype"), (
            f"graph cases run flash varlen attention and grouped expert GEMMs, which need "
            f"dtype bf16 (got {t.dtype}); their fp32 fallbacks read offsets on the host and "
            "cannot be captured")))
    if g.warmup_steps >= t.steps:
        problems.append(Problem(_at("graphs.warmup_steps"), (
            f"{g.warmup_steps} eager warmup steps leave none of the {t.steps} train.steps for the "
            "graphs; use fewer warmup steps or more steps")))
    return problems


def graph_arms_problem(case: BaseCase, field: str) -> list[Problem]:
    """A comparison of CUDA-graph arms (at ``field``) in a built-in case without ``graphs:`` (a
    command case has graph arms through ``command.arms.graph``)."""
    if case.graphs is None and case.command is None:
        return [Problem(_at(field), "compares CUDA-graph arms: add a `graphs:` section (e.g. "
                                    "graphs: {scope: attn, warmup_steps: 2})")]
    return []


def check_comparisons(case: BaseCase) -> list[Problem]:
    """The rules of each comparison the case's ``compare:`` section sets, in the sections'
    order (each comparison's module owns its rules: ``harness.spec.comparisons``). An arm's
    case has no ``compare:`` section."""
    problems: list[Problem] = []
    if not isinstance(case, Case):
        return problems
    for section in sections():
        settings = settings_of(case, section.name)
        if settings is not None:
            problems.extend(section.rules(case, settings))
    return problems


def check_memory_probe(case: BaseCase) -> list[Problem]:
    step = case.train.memory_probe_step
    if step is not None and step > case.train.steps:
        return [Problem(_at("train.memory_probe_step"),
                        f"step {step} is after the last of the {case.train.steps} train.steps")]
    return []


def check_emulate(case: BaseCase) -> list[Problem]:
    """``emulate.ranks``: what an emulated rank needs (see the module docstring)."""
    spec = case.emulate
    if spec is None:
        return []
    field, world = _at("emulate.ranks"), case.layout.world
    size = (f"{world} ranks (resources.nodes {case.resources.nodes} x resources.gpus_per_node "
            f"{case.resources.gpus_per_node})")
    if not spec.ranks:
        return [Problem(field, f"lists no rank; give the global ranks of the case's {size} to "
                               f"run alone, e.g. [0, {world - 1}] (the first rank of the first "
                               "pipeline stage and the last rank of the last)")]
    if world == 1:
        return [Problem(_at("emulate"), (
            "the case has 1 rank, which runs as it is: emulation stands one device in for one "
            "rank of a larger layout; remove emulate, or raise resources.gpus_per_node / nodes "
            "to the layout you are sizing"))]
    problems: list[Problem] = []
    twice = sorted({r for r in spec.ranks if spec.ranks.count(r) > 1})
    if twice:
        problems.append(Problem(field, (
            f"rank(s) {', '.join(map(str, twice))} listed more than once: each emulated rank runs "
            "once and records into its own rank<r>.jsonl")))
    outside = [r for r in spec.ranks if not 0 <= r < world]
    if outside:
        problems.append(Problem(field, (
            f"rank(s) {', '.join(map(str, outside))} not in the case's world of {size}: an "
            f"emulated rank runs as rank r of that world, so r is one of 0..{world - 1}")))
    return problems


CHECKS: tuple[Callable[[BaseCase], list[Problem]], ...] = (
    check_layout,
    check_layers,
    check_experts,
    check_attention,
    check_sequences,
    check_microbatches,
    check_microbatch_fill,
    check_comparisons,
    check_shapes,
    check_graphs,
    check_memory_probe,
    check_emulate,
)

# A command case (``command:``): what its comparisons need of it and its own rules
# (``harness.spec.command``) in place of the built-in workload's model, microbatch, shape and
# graph rules.
COMMAND_CHECKS: tuple[Callable[[BaseCase], list[Problem]], ...] = (
    check_layout, check_comparisons, command_problems, check_command)


def preflight(case: BaseCase, checks: Optional[Sequence[Callable[[BaseCase], list[Problem]]]] = None
              ) -> list[Problem]:
    """Every problem found in ``case`` (a user's case or an arm's; empty when it may run), in
    check order."""
    found: list[Problem] = []
    if checks is None:
        checks = COMMAND_CHECKS if case.command is not None else CHECKS
    for check in checks:
        found.extend(check(case))
    return found
