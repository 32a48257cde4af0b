from __future__ import annotations

import pytest

from harness.spec import PRESETS
from harness.spec.presets import UnknownPresetError, resolve_model
from harness.spec.schema import ModelSpec


def test_qwen3_30b_a3b_shape() -> None:
    m = resolve_model(ModelSpec(preset="qwen3-30b-a3b"))
    assert (m.layers, m.hidden, m.heads, m.kv_heads, m.head_dim) == (48, 2048, 32, 4, 128)
    assert (m.experts, m.experts_per_token, m.moe_ffn, m.vocab) == (128, 8, 768, 151936)
    assert m.rope_theta == 1e6 and m.norm_eps == 1e-6
    assert m.preset == "qwen3-30b-a3b"


def test_tiny_is_small_and_consistent() -> None:
    m = resolve_model(ModelSpec())
    assert m.preset == "tiny"
    assert m.hidden <= 128 and m.vocab <= 512 and m.layers <= 4
    assert m.heads % m.kv_heads == 0 and m.experts_per_token <= m.experts


def test_overrides_replace_only_given_fields() -> None:
    m = resolve_model(ModelSpec(preset="qwen3-30b-a3b", layers=8, experts=16,
                                aux_loss_coeff=0.0))
    assert (m.layers, m.experts, m.aux_loss_coeff) == (8, 16, 0.0)
    assert m.hidden == PRESETS["qwen3-30b-a3b"].hidden


def test_presets_are_read_only() -> None:
    with pytest.raises(TypeError):
        PRESETS["mine"] = PRESETS["tiny"]  # type: ignore[index]


def test_unknown_preset_lists_known_ones() -> None:
    with pytest.raises(UnknownPresetError, match="unknown model preset 'qwen9'.*qwen3-30b-a3b, tiny"):
        resolve_model(ModelSpec(preset="qwen9"))


def test_every_preset_field_can_be_overridden_and_presets_are_frozen() -> None:
    from pydantic import ValidationError

    from harness.spec.presets import ModelPreset
    from harness.spec.schema import ResolvedModel

    shape = set(ModelPreset.model_fields)
    assert shape <= set(ModelSpec.model_fields)
    assert set(ResolvedModel.model_fields) == shape | {"preset", "aux_loss_coeff"}
    with pytest.raises(ValidationError, match="frozen"):
        PRESETS["tiny"].layers = 3  # type: ignore[misc]
