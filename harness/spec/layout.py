"""The parallel layout of a case: its degrees, the sizes derived from them and their rules, in one
object (torchtitan's ``ParallelDims`` is the model).

:class:`ParallelLayout` (``Case.layout``) holds the degrees (``pp``, ``vpp``, ``ep``, the fixed CP
size or the dynamic-CP sizes, the microbatch group), the world (``resources.nodes x
resources.gpus_per_node``) and what a step lays over it (``train.seq_length``,
``train.max_seqlen_per_rank``, ``train.global_batch``). It derives what the rest of the harness
uses: the DP x CP pool of one pipeline stage (``dp_cp = world / pp``), ``dp``, the tokens one rank
holds in static-shape mode, the sequence multiple ``2 x cp``, the microbatch counts the pipeline
schedule runs (the core's ``slotmem.schedule`` rules), and the rank arithmetic of the process
groups. :meth:`ParallelLayout.problems` lists what is wrong with it, each at the case field to
change; preflight reports them, and the packer, the runtime and ``dcp-harness plan`` take a
layout preflight passed as it is (none of them derives these numbers again or repeats a rule).
Pure: no torch.

The rules (``problems``):

* ``world`` divisible by ``pp``. Fixed CP: ``world`` divisible by ``pp * cp`` (``world = pp * dp *
  cp``). Dynamic CP: every ``dynamic_cp`` size a power of two dividing ``dp_cp``.
* ``vpp > 1`` needs ``pp > 1`` (Megatron's interleaved schedule); with ``vpp > 1`` the microbatch
  group (``parallel.microbatch_group``, default ``pp``) is at least ``pp``.
* ``ep`` divides ``dp_cp``.
* Sequences. Fixed CP: ``seq_length`` divisible by the sequence multiple (``2 * cp`` with
  ``cp > 1``: the load-balanced causal split into ``2 * cp`` chunks; Megatron asserts it only when
  CP is on), and no ``max_seqlen_per_rank`` (it would be silently unused). Dynamic CP:
  ``max_seqlen_per_rank`` given, even, and ``max_seqlen_per_rank * max(dynamic_cp) >= seq_length``.
* ``global_batch``: fixed CP, divisible by ``dp``; dynamic CP, at least ``dp_cp`` (no rank of the
  pool may be left without data).

Rank order (Megatron's ``tp-cp-ep-dp-pp`` without TP): global rank = ``pp_rank * dp_cp +
pool_rank``. CP groups of size ``c`` are the contiguous, aligned blocks ``[k*c, (k+1)*c)`` of a
stage's pool (fixed CP uses one size, dynamic CP one set per allowed size, as Megatron's
``create_dynamic_dp_cp_groups``); EP groups are contiguous blocks of ``ep`` pool ranks; expert-DP
groups join the pool ranks with the same EP rank.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Optional

from harness.slotmem.schedule import group_problem, microbatch_count_problem
from harness.spec.problems import Problem, at

if TYPE_CHECKING:
    from harness.spec.schema import Case


def is_pow2(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def cp_divides_problem(size: int, dp_cp: int) -> Optional[str]:
    """A CP size must divide the DP x CP ranks of a pipeline stage: its CP groups are the aligned,
    contiguous blocks of that pool (the rule for a fixed CP size)."""
    if size < 1 or dp_cp % size:
        return f"CP size {size} does not divide the {dp_cp} DP x CP ranks of a pipeline stage"
    return None


def cp_size_problem(size: int, dp_cp: int) -> Optional[str]:
    """A dynamic-CP size (or the fixed CP a DCP case is compared with) must also be a power of two
    (Megatron's dynamic CP groups)."""
    if not is_pow2(size) or cp_divides_problem(size, dp_cp) is not None:
        return (f"CP size {size} must be a power of two dividing the {dp_cp} DP x CP ranks of a "
                "pipeline stage")
    return None


def sequence_multiple(cp: int) -> int:
    """What a sequence's length is padded to at CP size ``cp``: ``2 * cp`` (each CP rank holds chunk
    ``r`` and ``2cp - 1 - r``, the load-balanced causal split), 1 without CP."""
    return 2 * cp if cp > 1 else 1


def padded_length(length: int, cp: int) -> int:
    """A sequence of ``length`` tokens padded to the :func:`sequence_multiple` of ``cp``: what it
    occupies in a CP group (the packer's capacities and the packing check count these)."""
    m = sequence_multiple(cp)
    return -(-length // m) * m


@dataclass(frozen=True)
class ParallelLayout:
    """A case's parallel layout (see the module docstring); ``Case.layout`` builds it."""

    nodes: int
    gpus_per_node: int
    seq_length: int
    global_batch: int
    pp: int = 1
    vpp: int = 1
    ep: int = 1
    # Fixed CP: the one CP size; dynamic CP: the allowed sizes, ascending.
    cp_sizes: tuple[int, ...] = (1,)
    dynamic: bool = False
    # Megatron's microbatch_group_size_per_vp_stage as given; None: pp (``group``).
    microbatch_group: Optional[int] = None
    max_seqlen_per_rank: Optional[int] = None

    @classmethod
    def of(cls, case: "Case") -> "ParallelLayout":
        p, t, r = case.parallel, case.train, case.resources
        return cls(
            nodes=r.nodes, gpus_per_node=r.gpus_per_node, seq_length=t.seq_length,
            global_batch=t.global_batch, pp=p.pp, vpp=p.vpp, ep=p.ep,
            cp_sizes=tuple(p.dynamic_cp) if p.dynamic_cp is not None else (p.cp or 1,),
            dynamic=p.dynamic_cp is not None, microbatch_group=p.microbatch_group,
            max_seqlen_per_rank=t.max_seqlen_per_rank,
        )

    def at_fixed_cp(self, cp: int) -> "ParallelLayout":
        """This layout with every microbatch at CP size ``cp``: the layout of the fixed-CP arm of a
        dynamic-CP case (``harness.spec.derive.as_fixed_cp``; ``max_seqlen_per_rank`` dropped)."""
        return dataclasses.replace(self, cp_sizes=(cp,), dynamic=False, max_seqlen_per_rank=None)

    # ------------------------------------------------------------------ derived sizes
    @property
    def world(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def max_cp(self) -> int:
        return max(self.cp_sizes)

    @property
    def dp_cp(self) -> int:
        """Ranks of one pipeline stage: the DP x CP pool (world / pp)."""
        return self.world // self.pp

    @property
    def dp(self) -> int:
        """Static data-parallel degree: dp_cp / cp for fixed CP; for dynamic CP the whole DP x CP
        pool is the static DP group, carved into CP groups per microbatch."""
        return self.dp_cp if self.dynamic else self.dp_cp // self.max_cp

    @property
    def sequences_per_dp_rank(self) -> int:
        """Sequences of a step each DP rank trains: ``global_batch / dp`` (whole once
        :meth:`problems` holds; with dynamic CP, ``dp`` is the whole DP x CP pool)."""
        return self.global_batch // self.dp

    @property
    def most_microbatches(self) -> int:
        """The most microbatches a step can run, every one holding a sequence: with fixed CP the
        sequences per DP rank (:attr:`sequences_per_dp_rank`); with dynamic CP, or a layout whose
        ``dp`` is not whole (:attr:`exact`), the global batch."""
        return self.sequences_per_dp_rank if self.exact and not self.dynamic else self.global_batch

    @property
    def exact(self) -> bool:
        """Whether the world splits exactly into ``pp`` stages of ``dp_cp`` ranks (and, with fixed
        CP, ``dp_cp`` into ``dp`` groups of ``cp``), so that ``dp_cp`` and ``dp`` are exact."""
        if self.world % self.pp:
            return False
        return self.dynamic or self.world % (self.pp * self.max_cp) == 0

    @property
    def group(self) -> int:
        """The microbatch group of the interleaved schedule (default ``pp``)."""
        return self.microbatch_group or self.pp

    @property
    def model_chunks(self) -> int:
        """Model chunks the layers are split over (``pp * vpp``)."""
        return self.pp * self.vpp

    @property
    def tokens_per_rank(self) -> int:
        """Static shapes: each rank's microbatch buffer, ``max_seqlen_per_rank`` with dynamic CP,
        ``seq_length / cp`` with fixed CP (Megatron's pad-packed-seq alignment 'max')."""
        if not self.dynamic:
            return self.seq_length // self.max_cp
        if self.max_seqlen_per_rank is None:
            raise ValueError("dynamic CP without train.max_seqlen_per_rank (preflight reports it)")
        return self.max_seqlen_per_rank

    @property
    def single_rank(self) -> bool:
        """One rank without PP, CP or EP: the layout of the ``reference`` arm."""
        return (self.world == 1 and self.pp == 1 and self.ep == 1 and self.max_cp == 1
                and not self.dynamic)

    def microbatch_count_problem(self, microbatches: int) -> Optional[str]:
        """Why the pipeline schedule cannot run ``microbatches`` microbatches (None: it can)."""
        return microbatch_count_problem(self.pp, self.vpp, self.group, microbatches)

    # ------------------------------------------------------------------ rules
    def _world_text(self) -> str:
        return (f"world size {self.world} (resources.nodes {self.nodes} x resources.gpus_per_node "
                f"{self.gpus_per_node})")

    def problems(self) -> list[Problem]:
        """Everything wrong with this layout (empty when it holds), each at the case field to
        change, in a fixed order: world, schedule, EP, sequences, batch."""
        out: list[Problem] = []
        pp, world = self.pp, self.world
        if world % pp:
            out.append(Problem(at("parallel.pp"),
                               f"pp={pp} does not divide the {self._world_text()}"))
        elif not self.dynamic:
            cp = self.max_cp
            if world % (pp * cp):
                out.append(Problem(at("parallel.cp"), (
                    f"the {self._world_text()} is not divisible by pp*cp = {pp}*{cp} = "
                    f"{pp * cp}; world must equal pp*dp*cp")))
        else:
            bad = [s for s in self.cp_sizes if cp_size_problem(s, self.dp_cp) is not None]
            if bad:
                out.append(Problem(at("parallel.dynamic_cp"), (
                    f"CP sizes {bad} must be powers of two dividing the {self.dp_cp} DP x CP ranks "
                    f"of a pipeline stage (world {world} / pp {pp})")))
        if self.vpp > 1 and pp == 1:
            out.append(Problem(at("parallel.vpp"),
                               f"vpp={self.vpp} needs pp > 1 (interleaved pipeline schedule)"))
        why = group_problem(pp, self.vpp, self.group)
        if why is not None:
            out.append(Problem(at("parallel.microbatch_group"), why))
        if world % pp == 0 and self.dp_cp % self.ep:
            out.append(Problem(at("parallel.ep"), (
                f"ep={self.ep} does not divide the {self.dp_cp} DP x CP ranks of a pipeline stage "
                f"(world {world} / pp {pp})")))
        out.extend(self._sequence_problems())
        out.extend(self._batch_problems())
        return out

    def _sequence_problems(self) -> list[Problem]:
        seq, msr = self.seq_length, self.max_seqlen_per_rank
        field = at("train.max_seqlen_per_rank")
        if self.dynamic:
            top = self.max_cp
            if msr is None:
                return [Problem(field, "dynamic CP needs max_seqlen_per_rank (tokens one rank may "
                                       "hold)")]
            if msr % 2:
                return [Problem(field, f"max_seqlen_per_rank={msr} must be even")]
            if msr * top < seq:
                return [Problem(field, (
                    f"max_seqlen_per_rank {msr} x largest CP size {top} = {msr * top} tokens "
                    f"cannot hold a sequence of seq_length {seq}"))]
            return []
        out = []
        cp = self.max_cp
        if seq % sequence_multiple(cp):
            out.append(Problem(at("train.seq_length"),
                               f"seq_length {seq} must be divisible by 2*cp = {2 * cp}"))
        if msr is not None:
            out.append(Problem(field, "max_seqlen_per_rank only applies to dynamic CP "
                                      "(parallel.dynamic_cp); remove it for fixed CP"))
        return out

    def _batch_problems(self) -> list[Problem]:
        if not self.exact:
            return []  # dp is not defined: reported above
        gbs, field = self.global_batch, at("train.global_batch")
        if self.dynamic:
            if gbs < self.dp_cp:
                return [Problem(field, (
                    f"global_batch {gbs} is smaller than the {self.dp_cp} DP x CP ranks of a "
                    "pipeline stage; every rank needs data"))]
        elif gbs % self.dp:
            return [Problem(field, f"global_batch {gbs} is not divisible by dp={self.dp}")]
        return []

    # ------------------------------------------------------------------ rank arithmetic
    def pp_rank(self, rank: int) -> int:
        return rank // self.dp_cp

    def pool_rank(self, rank: int) -> int:
        return rank % self.dp_cp

    def global_rank(self, pp_rank: int, pool_rank: int) -> int:
        return pp_rank * self.dp_cp + pool_rank

    def ep_rank(self, rank: int) -> int:
        return self.pool_rank(rank) % self.ep

    def pp_ranks(self, rank: int) -> tuple[int, ...]:
        """The ranks of ``rank``'s pipeline (one per stage)."""
        return tuple(self.global_rank(s, self.pool_rank(rank)) for s in range(self.pp))

    def pool_ranks(self, pp_rank: int) -> tuple[int, ...]:
        """The DP x CP pool of stage ``pp_rank``."""
        return tuple(self.global_rank(pp_rank, i) for i in range(self.dp_cp))

    def cp_blocks(self, pp_rank: int, size: int) -> list[tuple[int, ...]]:
        """The CP groups of size ``size`` of stage ``pp_rank``: aligned contiguous pool blocks."""
        base = self.pool_ranks(pp_rank)
        return [base[k : k + size] for k in range(0, self.dp_cp - size + 1, size)]

    def ep_blocks(self, pp_rank: int) -> list[tuple[int, ...]]:
        return self.cp_blocks(pp_rank, self.ep)

    def expert_dp_groups(self, pp_rank: int) -> list[tuple[int, ...]]:
        """Pool ranks of stage ``pp_rank`` with the same EP rank (expert-gradient all-reduce)."""
        base = self.pool_ranks(pp_rank)
        return [tuple(base[j :: self.ep]) for j in range(self.ep)]
