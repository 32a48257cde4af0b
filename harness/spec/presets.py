"""Model-shape presets and their resolution (preset + non-null overrides -> ResolvedModel)."""

from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from harness.spec.schema import ModelPreset, ModelSpec, ResolvedModel

__all__ = ["PRESETS", "ModelPreset", "UnknownPresetError", "resolve_model"]


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


def resolve_model(spec: ModelSpec) -> ResolvedModel:
    """The preset named by ``spec.preset`` with every non-null field of ``spec`` laid over it."""
    preset = PRESETS.get(spec.preset)
    if preset is None:
        known = ", ".join(sorted(PRESETS))
        raise UnknownPresetError(f"unknown model preset '{spec.preset}'; known presets: {known}")
    fields = preset.model_dump()
    for name in fields:
        value = getattr(spec, name)
        if value is not None:
            fields[name] = value
    return ResolvedModel(preset=spec.preset, aux_loss_coeff=spec.aux_loss_coeff, **fields)
