"""Per-rank shapes and all-reduces against values computed by hand from the published configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.kernels.models import (
    DEEPSEEK_V3,
    KIMI_K2_5,
    ModelSpec,
    allreduces_per_step,
    expected_active_experts,
    get_model,
    rank_gemms,
    spec_from_config_file,
)

# Kimi-K2 text config keys as published in the model's config.json (hidden 7168, 61 layers, 384 experts top-8,
# MLA q_lora 1536 / kv_lora 512); K2.5 nests them under text_config.
KIMI_TEXT_CONFIG = {
    "model_type": "kimi_k2",
    "hidden_size": 7168,
    "num_hidden_layers": 61,
    "first_k_dense_replace": 1,
    "intermediate_size": 18432,
    "n_routed_experts": 384,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 2048,
    "num_attention_heads": 64,
    "q_lora_rank": 1536,
    "kv_lora_rank": 512,
    "qk_nope_head_dim": 128,
    "qk_rope_head_dim": 64,
    "v_head_dim": 128,
    "vocab_size": 163840,
    "moe_layer_freq": 1,
    "num_nextn_predict_layers": 0,
    "quantization_config": {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 32, "symmetric": True}}},
    },
}


def shapes_by_op(spec: ModelSpec, tp: int) -> dict[str, tuple[int, int, int]]:
    return {s.op: (s.k, s.n, s.count) for s in rank_gemms(spec, tp)}


def test_kimi_tp8_expert_shapes() -> None:
    ops = shapes_by_op(KIMI_K2_5, 8)
    assert ops["gate_up"] == (7168, 512, 60)  # 2 x 2048 / 8, 60 MoE layers
    assert ops["down"] == (256, 7168, 60)
    assert ops["shared_gate_up"] == (7168, 512, 60)
    assert ops["shared_down"] == (256, 7168, 60)
    assert ops["router"] == (7168, 384, 60)


def test_kimi_tp8_attention_dense_lm_head() -> None:
    ops = shapes_by_op(KIMI_K2_5, 8)
    assert ops["fused_qkv_a"] == (7168, 1536 + 512 + 64, 61)  # replicated
    assert ops["q_b_proj"] == (1536, 8 * (128 + 64), 61)  # 64 heads / 8 = 8 per rank
    assert ops["kv_b_proj"] == (512, 8 * (128 + 128), 61)
    assert ops["o_proj"] == (8 * 128, 7168, 61)
    assert ops["dense_gate_up"] == (7168, 2 * 18432 // 8, 1)
    assert ops["dense_down"] == (18432 // 8, 7168, 1)
    assert ops["lm_head"] == (7168, 163840 // 8, 1)


def test_kimi_expert_weights_are_int4_group32() -> None:
    gate_up = next(s for s in rank_gemms(KIMI_K2_5, 8) if s.op == "gate_up")
    assert (gate_up.weight_bits, gate_up.group_size) == (4, 32)
    # 7168 x 512 nibbles + (7168 / 32) x 512 bf16 scales
    assert gate_up.weight_bytes() == 7168 * 512 // 2 + 224 * 512 * 2


def test_kimi_tp8_allreduces() -> None:
    ar = allreduces_per_step(KIMI_K2_5, 8, 1)
    assert ar.count == 123
    assert ar.bytes_each == 14336
    assert allreduces_per_step(KIMI_K2_5, 8, 64).bytes_each == 64 * 7168 * 2
    assert allreduces_per_step(KIMI_K2_5, 1, 1).count == 0


def test_deepseek_v3_tp8() -> None:
    ops = shapes_by_op(DEEPSEEK_V3, 8)
    assert ops["gate_up"] == (7168, 512, 58)  # first 3 dense
    assert ops["dense_gate_up"] == (7168, 4608, 3)
    assert ops["router"] == (7168, 256, 58)
    assert ops["q_b_proj"] == (1536, 16 * 192, 61)  # 128 heads / 8
    assert ops["o_proj"] == (16 * 128, 7168, 61)
    assert ops["lm_head"] == (7168, 129280 // 8, 1)
    assert DEEPSEEK_V3.num_mtp_layers == 1
    assert DEEPSEEK_V3.expert_weight_bits == 16


def test_nested_text_config_from_file(tmp_path: Path) -> None:
    config = {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": {k: v for k, v in KIMI_TEXT_CONFIG.items() if k != "quantization_config"},
        "quantization_config": KIMI_TEXT_CONFIG["quantization_config"],
        "vision_config": {"hidden_size": 1152},
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = spec_from_config_file(tmp_path, name="kimi-k2.5")
    assert spec == KIMI_K2_5
    assert get_model(tmp_path / "config.json").hidden_size == 7168


def test_flat_config_equals_nested(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps(KIMI_TEXT_CONFIG))
    assert spec_from_config_file(tmp_path / "config.json", name="kimi-k2.5") == KIMI_K2_5


def test_gqa_moe_config(tmp_path: Path) -> None:
    # The tiny Qwen3-MoE model the serving suites generate (pytest_moeperf/serving/models/tinymodel.py).
    config = {
        "architectures": ["Qwen3MoeForCausalLM"],
        "vocab_size": 512, "hidden_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "num_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 64, "intermediate_size": 256, "decoder_sparse_step": 1,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = spec_from_config_file(tmp_path)
    ops = shapes_by_op(spec, 2)
    assert ops["qkv_proj"] == (128, (2 + 2 * 1) * 32, 2)
    assert ops["o_proj"] == (64, 128, 2)
    assert ops["gate_up"] == (128, 64, 2)
    assert ops["down"] == (32, 128, 2)
    assert "dense_gate_up" not in ops and "shared_gate_up" not in ops
    assert allreduces_per_step(spec, 2, 4).count == 5


def test_missing_key_is_named() -> None:
    from pytest_moeperf.kernels.models import spec_from_config

    with pytest.raises(ValueError, match="hidden_size"):
        spec_from_config({"num_attention_heads": 4}, "broken")


def test_indivisible_tp_is_rejected() -> None:
    with pytest.raises(ValueError, match="tp = 3"):
        rank_gemms(KIMI_K2_5, 3)


def test_active_experts() -> None:
    assert expected_active_experts(KIMI_K2_5, 1) == pytest.approx(8.0)
    # 384 x (1 - (1 - 8/384)^256)
    assert expected_active_experts(KIMI_K2_5, 256) == pytest.approx(384 * (1 - (376 / 384) ** 256))
    assert 380 < expected_active_experts(KIMI_K2_5, 256) < 384


def test_unknown_model() -> None:
    with pytest.raises(KeyError, match="kimi-k2.5"):
        get_model("no-such-model")
