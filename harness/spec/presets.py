"""Model-shape presets and their resolution (preset + non-null overrides -> ResolvedModel)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from types import MappingProxyType
from typing import Mapping

from harness.spec.schema import ModelSpec, ResolvedModel


@dataclass(frozen=True)
class ModelPreset:
    """Every shape field of a model; a case's ``model:`` section may override any of them."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    experts: int
    experts_per_token: int
    moe_ffn: int
    vocab: int
    rope_theta: float
    norm_eps: float


PRESETS: Mapping[str, ModelPreset] = MappingProxyType(
    {
        # Qwen3-30B-A3B (Qwen3-MoE): 48 layers, GQA 32/4 heads of 128, 128 experts top-8.
        "qwen3-30b-a3b": ModelPreset(
            layers=48,
            hidden=2048,
            heads=32,
            kv_heads=4,
            head_dim=128,
            experts=128,
            experts_per_token=8,
            moe_ffn=768,
            vocab=151936,
            rope_theta=1.0e6,
            norm_eps=1.0e-6,
        ),
        # Same structure, small enough to train for real on a CPU in seconds.
        "tiny": ModelPreset(
            layers=4,
            hidden=64,
            heads=4,
            kv_heads=2,
            head_dim=16,
            experts=8,
            experts_per_token=2,
            moe_ffn=64,
            vocab=256,
            rope_theta=1.0e4,
            norm_eps=1.0e-6,
        ),
    }
)


class UnknownPresetError(ValueError):
    """``model.preset`` names no known preset."""


def unknown_preset_message(name: str) -> str:
    known = ", ".join(sorted(PRESETS))
    return f"unknown model preset '{name}'; known presets: {known}"


def resolve_model(spec: ModelSpec) -> ResolvedModel:
    """The preset named by ``spec.preset`` with every non-null field of ``spec`` laid over it."""
    preset = PRESETS.get(spec.preset)
    if preset is None:
        raise UnknownPresetError(unknown_preset_message(spec.preset))
    fields = asdict(preset)
    for name in fields:
        value = getattr(spec, name)
        if value is not None:
            fields[name] = value
    return ResolvedModel(preset=spec.preset, aux_loss_coeff=spec.aux_loss_coeff, **fields)
