"""Upper bounds of every size a case file or the command line can set, and why.

A size past these is a typo or a unit mix-up (``steps: 1e23``), not a regression case: the harness
would try to honour it and grow until it is killed (the step checks hold every step in memory; the
planner walks every microbatch of every count). The schema (``le=``), its error messages
(``validation.py``) and ``dcp-harness plan`` read the bounds from here, so one number has one
reason in one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Optional


@dataclass(frozen=True)
class Limit:
    """The largest value a size may take, and why (said in the error)."""

    max: int
    reason: str


_TOKENS = Limit(1 << 22, "4M tokens per sequence or rank is beyond any context-parallel "
                         "configuration this harness models")
MICROBATCHES = Limit(4096, "the slot planner walks every microbatch of every reachable count, "
                           "and past 4096 it runs for minutes")
STEPS = Limit(1_000_000, "a regression case runs minutes to hours, and the checks hold every "
                         "step's records in memory")

LIMITS: Mapping[str, Limit] = MappingProxyType({
    "model.layers": Limit(1024, "deeper than any MoE model this harness reproduces; every layer "
                                "is planned and captured"),
    "model.hidden": Limit(65536, "wider than any model this harness reproduces"),
    "model.heads": Limit(1024, "more attention heads than any model this harness reproduces"),
    "model.kv_heads": Limit(1024, "more KV heads than any model this harness reproduces"),
    "model.head_dim": Limit(1024, "wider heads than any attention kernel takes"),
    "model.experts": Limit(4096, "more experts than any MoE model this harness reproduces"),
    "model.experts_per_token": Limit(256, "more routed experts per token than any MoE model "
                                          "this harness reproduces"),
    "model.moe_ffn": Limit(262144, "wider expert FFNs than any model this harness reproduces"),
    "model.vocab": Limit(1 << 21, "a larger vocabulary than any tokenizer in use"),
    "parallel.pp": Limit(256, "more pipeline stages than any cluster job runs"),
    "parallel.vpp": Limit(64, "more model chunks per rank than Megatron's interleaved schedule "
                              "is used with"),
    "parallel.ep": Limit(4096, "a larger expert-parallel group than any cluster job runs"),
    "parallel.cp": Limit(1024, "a larger context-parallel group than any cluster job runs"),
    "parallel.microbatch_group": MICROBATCHES,
    "train.steps": STEPS,
    "train.global_batch": Limit(16384, "more sequences per step than Megatron's largest "
                                       "recipes, and `dcp-harness plan` plans every count up "
                                       "to it"),
    "train.seq_length": _TOKENS,
    "train.max_seqlen_per_rank": _TOKENS,
    "train.microbatches": MICROBATCHES,
    "train.checkpoint_every": STEPS,
    "data.lengths.min": _TOKENS,
    "data.lengths.max": _TOKENS,
    "resources.nodes": Limit(4096, "more nodes than any cluster partition has"),
    "resources.gpus_per_node": Limit(64, "ranks per node; the local launcher starts that many "
                                         "processes on one machine"),
    "resources.time_min": Limit(10080, "a week per arm; Slurm partitions rarely allow longer"),
})


def limit(path: str) -> int:
    """The bound of the schema field at dotted ``path`` (KeyError for a field without one)."""
    return LIMITS[path].max


def limit_reason(path: str) -> Optional[str]:
    """Why the field at dotted ``path`` has its bound (None: it has none)."""
    found = LIMITS.get(path)
    return found.reason if found else None
