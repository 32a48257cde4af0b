"""Synthetic training data: a step's global batch of variable-length sequences.

Everything here is a pure function of ``train.seed``, the step number and the ``train`` /
``data`` fields of a case, never of the parallel layout, so every layout of one case trains on the
same tokens. Tokens follow a fixed random "successor" rule over the vocabulary (with a little noise),
so a model that learns the bigram table drives the loss well below ``ln(vocab)``; a broken backward
leaves the loss at its initial level.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Union

import torch

from harness.errors import ConfigError
from harness.spec.schema import DataSpec, LengthDistribution, TrainSpec

# Probability that a token follows the successor rule (the rest are uniform noise).
RULE_PROB = 0.9

_LENGTH_STREAM = 1
_TOKEN_STREAM = 2
_RULE_STREAM = 3


_DATA_SALT = 0x9E3779B9


def keyed_generator(salt: int, *key: int) -> torch.Generator:
    """A CPU generator seeded from an integer key (stable across runs and layouts); ``salt``
    separates users (data here, weights in ``model.py``)."""
    seed = 0
    for k in key:
        seed = (seed * 1_000_003 + int(k) + salt) % (2**61 - 1)
    g = torch.Generator(device="cpu")
    g.manual_seed(seed)
    return g


def _generator(*key: int) -> torch.Generator:
    return keyed_generator(_DATA_SALT, *key)


def successor_table(seed: int, vocab: int) -> torch.Tensor:
    """The fixed rule ``next = table[current]``: a random permutation of the vocabulary."""
    return torch.randperm(vocab, generator=_generator(seed, _RULE_STREAM))


def sequence_lengths(train: TrainSpec, data: DataSpec, step: int) -> list[int]:
    """Lengths (tokens) of the ``train.global_batch`` sequences of 1-based ``step``."""
    spec = data.lengths
    hi = min(spec.max, train.seq_length)
    lo = min(spec.min, hi)
    if hi < 1:
        raise ConfigError(f"data.lengths.max / train.seq_length give no room for a token (max {hi})")
    g = _generator(train.seed, _LENGTH_STREAM, step)
    n = train.global_batch
    if spec.distribution is LengthDistribution.FIXED:
        raw = torch.full((n,), float(hi), dtype=torch.float64)
    elif spec.distribution is LengthDistribution.UNIFORM:
        raw = torch.randint(lo, hi + 1, (n,), generator=g).to(torch.float64)
    else:
        median = spec.median if spec.median is not None else math.sqrt(lo * hi)
        z = torch.randn(n, generator=g, dtype=torch.float64)
        raw = torch.exp(math.log(median) + spec.sigma * z)
    return [int(min(max(round(float(x)), lo), hi)) for x in raw]


@dataclass(frozen=True)
class Sequence:
    """One training sequence of a step: ``length`` inputs, each with a next-token target."""

    index: int  # position in the step's global batch
    length: int


def step_sequences(train: TrainSpec, data: DataSpec, step: int) -> tuple[Sequence, ...]:
    return tuple(Sequence(i, n) for i, n in enumerate(sequence_lengths(train, data, step)))


# The successor rule as ``successor_table`` gives it, or as a list (read once per run: a list
# lookup per token instead of converting the whole table for every sequence).
Table = Union[torch.Tensor, list[int]]


def sequence_tokens(
    seed: int, step: int, index: int, length: int, vocab: int, table: Table
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, targets)`` of one sequence, int64 of shape ``[length]`` each."""
    g = _generator(seed, _TOKEN_STREAM, step, index)
    first = int(torch.randint(0, vocab, (1,), generator=g))
    follow = (torch.rand(length, generator=g) < RULE_PROB).tolist()
    noise = torch.randint(0, vocab, (length,), generator=g).tolist()
    rule = table.tolist() if isinstance(table, torch.Tensor) else table
    toks = [first]
    for t in range(length):
        toks.append(rule[toks[-1]] if follow[t] else noise[t])
    out = torch.tensor(toks, dtype=torch.int64)
    return out[:-1], out[1:]
