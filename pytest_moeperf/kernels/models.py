"""MoE model specs and the per-rank GEMM shapes and all-reduces of one decode step under tensor parallelism.

A :class:`ModelSpec` holds what a Hugging Face ``config.json`` says about the text model (DeepSeek-V3 style MLA
+ MoE, or a plain GQA MoE such as Qwen3-MoE / Mixtral). :func:`rank_gemms` derives the per-rank weight shapes
at a TP degree the way vLLM shards them (column-parallel: N / tp, row-parallel: K / tp, replicated: whole), and
:func:`allreduces_per_step` the all-reduces of one decode step: one after the vocab-parallel embedding, one after
each layer's attention output projection and one after each layer's MLP/MoE (``1 + 2 × layers``), each of
``batch × hidden × 2`` bytes in bf16.

Shapes are ``K → N``: the GEMM reads ``[M, K]`` activations and a ``K × N`` weight and writes ``[M, N]``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

__all__ = [
    "AllReduce",
    "GemmShape",
    "ModelSpec",
    "MODELS",
    "allreduces_per_step",
    "expected_active_experts",
    "get_model",
    "model_names",
    "rank_gemms",
    "register_model",
    "spec_from_config",
    "spec_from_config_file",
]

Sharding = Literal["column", "row", "replicated"]
Attention = Literal["mla", "gqa"]


@dataclass(frozen=True)
class ModelSpec:
    """The text model's dimensions; ``None`` for what a model does not have (e.g. ``q_lora_rank`` in V2-Lite)."""

    name: str
    hidden_size: int
    num_layers: int
    first_k_dense: int
    dense_intermediate: int
    n_routed_experts: int
    n_shared_experts: int
    experts_per_token: int
    moe_intermediate: int
    num_heads: int
    vocab_size: int
    attention: Attention = "mla"
    # MLA
    q_lora_rank: int | None = None
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # GQA
    num_kv_heads: int = 0
    head_dim: int = 0
    shared_expert_intermediate: int = 0  # 0: n_shared_experts × moe_intermediate
    moe_layer_freq: int = 1
    num_mtp_layers: int = 0
    expert_weight_bits: int = 16  # routed experts; 4 for INT4 W4A16 checkpoints
    expert_group_size: int = 0  # quantisation group along K, 0 when not quantised
    tie_word_embeddings: bool = False

    def __post_init__(self) -> None:
        for field in ("hidden_size", "num_layers", "num_heads", "vocab_size", "experts_per_token"):
            if getattr(self, field) < 1:
                raise ValueError(f"{self.name}: {field} must be >= 1, got {getattr(self, field)}")
        if not 0 <= self.first_k_dense <= self.num_layers:
            raise ValueError(f"{self.name}: first_k_dense {self.first_k_dense} not in [0, {self.num_layers}]")
        if self.experts_per_token > max(self.n_routed_experts, 1):
            raise ValueError(f"{self.name}: experts_per_token > n_routed_experts")

    def is_moe_layer(self, index: int) -> bool:
        """Whether decoder layer ``index`` (0-based) has routed experts (DeepSeek ``first_k_dense_replace`` +
        ``moe_layer_freq`` rule; Qwen's ``decoder_sparse_step`` maps to ``moe_layer_freq``)."""
        if self.n_routed_experts == 0 or index < self.first_k_dense:
            return False
        return (index - self.first_k_dense) % self.moe_layer_freq == 0

    @property
    def moe_layers(self) -> int:
        return sum(self.is_moe_layer(i) for i in range(self.num_layers))

    @property
    def dense_layers(self) -> int:
        return self.num_layers - self.moe_layers

    @property
    def shared_intermediate(self) -> int:
        if self.shared_expert_intermediate:
            return self.shared_expert_intermediate
        return self.n_shared_experts * self.moe_intermediate


@dataclass(frozen=True)
class GemmShape:
    """One weight matrix kind on one rank.

    ``count`` is how many such matrices one decode step multiplies *per token group*: layers × matrices per
    layer; for ``gate_up``/``down`` (routed experts) it counts MoE layers only, and the number of experts a batch
    touches is a function of the batch (:func:`expected_active_experts`), not part of the shape.
    """

    op: str
    component: str  # attention / dense_mlp / shared_expert / routed_experts / router / lm_head
    k: int
    n: int
    count: int
    sharding: Sharding
    weight_bits: int = 16
    group_size: int = 0

    def weight_bytes(self) -> int:
        """Bytes of one matrix, including per-group scales (bf16) when quantised."""
        body = self.k * self.n * self.weight_bits // 8
        scales = (self.k // self.group_size) * self.n * 2 if self.group_size else 0
        return body + scales


@dataclass(frozen=True)
class AllReduce:
    """The all-reduces of one decode step: ``count`` collectives of ``bytes_each`` bytes."""

    count: int
    bytes_each: int
    where: str


def _split(value: int, tp: int, what: str) -> int:
    if value % tp:
        raise ValueError(f"{what} = {value} is not divisible by tp = {tp}")
    return value // tp


def rank_gemms(spec: ModelSpec, tp: int) -> list[GemmShape]:
    """Per-rank GEMM shapes of one decode step at tensor-parallel degree ``tp`` (vLLM's sharding, no EP).

    MLA: ``fused_qkv_a`` (q_a + kv_a with rope, replicated), ``q_b_proj`` and ``kv_b_proj`` (column),
    ``o_proj`` (row). Decode in vLLM absorbs ``kv_b_proj`` into two per-head batched GEMMs over the same weight
    bytes; it is listed as the one matrix. GQA: ``qkv_proj`` (column; KV heads replicated when fewer than tp),
    ``o_proj`` (row). MLP: ``dense_gate_up``/``dense_down``, ``shared_gate_up``/``shared_down``, routed
    ``gate_up``/``down``, each gate_up being gate and up fused (N = 2 × intermediate / tp). ``router`` is
    replicated; ``lm_head`` is vocab-parallel (column).
    """
    if tp < 1:
        raise ValueError(f"tp must be >= 1, got {tp}")
    h, layers = spec.hidden_size, spec.num_layers
    heads = _split(spec.num_heads, tp, f"{spec.name} num_heads")
    shapes: list[GemmShape] = []
    if spec.attention == "mla":
        qk_head = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        kv_a = spec.kv_lora_rank + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            shapes.append(GemmShape("fused_qkv_a", "attention", h, spec.q_lora_rank + kv_a, layers, "replicated"))
            shapes.append(GemmShape("q_b_proj", "attention", spec.q_lora_rank, heads * qk_head, layers, "column"))
        else:
            shapes.append(GemmShape("q_proj", "attention", h, heads * qk_head, layers, "column"))
            shapes.append(GemmShape("kv_a_proj", "attention", h, kv_a, layers, "replicated"))
        kv_b_n = heads * (spec.qk_nope_head_dim + spec.v_head_dim)
        shapes.append(GemmShape("kv_b_proj", "attention", spec.kv_lora_rank, kv_b_n, layers, "column"))
        shapes.append(GemmShape("o_proj", "attention", heads * spec.v_head_dim, h, layers, "row"))
    else:
        kv_heads = max(1, spec.num_kv_heads // tp)
        qkv_n = (heads + 2 * kv_heads) * spec.head_dim
        shapes.append(GemmShape("qkv_proj", "attention", h, qkv_n, layers, "column"))
        shapes.append(GemmShape("o_proj", "attention", heads * spec.head_dim, h, layers, "row"))
    if spec.dense_layers:
        inter = _split(spec.dense_intermediate, tp, f"{spec.name} dense intermediate")
        shapes.append(GemmShape("dense_gate_up", "dense_mlp", h, 2 * inter, spec.dense_layers, "column"))
        shapes.append(GemmShape("dense_down", "dense_mlp", inter, h, spec.dense_layers, "row"))
    moe = spec.moe_layers
    if moe:
        if spec.shared_intermediate:
            shared = _split(spec.shared_intermediate, tp, f"{spec.name} shared intermediate")
            shapes.append(GemmShape("shared_gate_up", "shared_expert", h, 2 * shared, moe, "column"))
            shapes.append(GemmShape("shared_down", "shared_expert", shared, h, moe, "row"))
        shapes.append(GemmShape("router", "router", h, spec.n_routed_experts, moe, "replicated"))
        inter = _split(spec.moe_intermediate, tp, f"{spec.name} moe intermediate")
        bits, group = spec.expert_weight_bits, spec.expert_group_size
        shapes.append(GemmShape("gate_up", "routed_experts", h, 2 * inter, moe, "column", bits, group))
        shapes.append(GemmShape("down", "routed_experts", inter, h, moe, "row", bits, group))
    vocab = math.ceil(spec.vocab_size / tp)
    shapes.append(GemmShape("lm_head", "lm_head", h, vocab, 1, "column"))
    return shapes


def allreduces_per_step(spec: ModelSpec, tp: int, batch: int, *, dtype_bytes: int = 2) -> AllReduce:
    """All-reduces of one decode step of ``batch`` tokens: ``1 + 2 × num_layers`` of ``batch × hidden`` elements
    (embedding, then attention output and MLP/MoE output of every layer). None at ``tp == 1``."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    count = 0 if tp == 1 else 1 + 2 * spec.num_layers
    return AllReduce(count, batch * spec.hidden_size * dtype_bytes, "embedding + 2 per layer (attention, MLP/MoE)")


def expected_active_experts(spec: ModelSpec, batch: int) -> float:
    """Expected number of distinct routed experts a batch of ``batch`` tokens touches under uniform top-k
    routing: ``E × (1 − (1 − k/E)^batch)``."""
    e, k = spec.n_routed_experts, spec.experts_per_token
    if e == 0:
        return 0.0
    return e * (1.0 - (1.0 - k / e) ** batch)


# --------------------------------------------------------------------------------------------- HF config.json


def _text_config(config: Mapping[str, Any]) -> Mapping[str, Any]:
    nested = config.get("text_config")
    if isinstance(nested, Mapping):
        merged = dict(nested)
        if "quantization_config" not in merged and "quantization_config" in config:
            merged["quantization_config"] = config["quantization_config"]
        return merged
    return config


def _expert_quant(config: Mapping[str, Any]) -> tuple[int, int]:
    """(bits, group size) of routed experts from a compressed-tensors / GPTQ / AWQ ``quantization_config``."""
    quant = config.get("quantization_config")
    if not isinstance(quant, Mapping):
        return 16, 0
    groups = quant.get("config_groups")
    if isinstance(groups, Mapping):
        for group in groups.values():
            weights = group.get("weights") if isinstance(group, Mapping) else None
            if isinstance(weights, Mapping) and "num_bits" in weights:
                return int(weights["num_bits"]), int(weights.get("group_size") or 0)
    if "bits" in quant:
        return int(quant["bits"]), int(quant.get("group_size") or 0)
    return 16, 0


def spec_from_config(config: Mapping[str, Any], name: str) -> ModelSpec:
    """A :class:`ModelSpec` from a parsed HF ``config.json`` (top-level or nested under ``text_config``).

    DeepSeek-V2/V3/Kimi keys (``n_routed_experts``, ``kv_lora_rank``, ``first_k_dense_replace`` …) give an MLA
    spec; Qwen-MoE / Mixtral keys (``num_experts`` / ``num_local_experts``, ``num_key_value_heads``,
    ``decoder_sparse_step``) a GQA one. Missing required keys raise ``ValueError`` naming the key.
    """
    c = _text_config(config)

    def need(*keys: str) -> int:
        for key in keys:
            if c.get(key) is not None:
                return int(c[key])
        raise ValueError(f"{name}: config has none of {', '.join(keys)}")

    def opt(key: str, default: int = 0) -> int:
        value = c.get(key)
        return default if value is None else int(value)

    bits, group = _expert_quant(c)
    hidden = need("hidden_size")
    heads = need("num_attention_heads")
    n_experts = opt("n_routed_experts") or opt("num_experts") or opt("num_local_experts")
    common: dict[str, Any] = dict(
        name=name,
        hidden_size=hidden,
        num_layers=need("num_hidden_layers"),
        dense_intermediate=need("intermediate_size"),
        n_routed_experts=n_experts,
        experts_per_token=need("num_experts_per_tok"),
        num_heads=heads,
        vocab_size=need("vocab_size"),
        num_mtp_layers=opt("num_nextn_predict_layers"),
        expert_weight_bits=bits,
        expert_group_size=group,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
    )
    if c.get("kv_lora_rank") is not None:
        return ModelSpec(
            **common,
            attention="mla",
            first_k_dense=opt("first_k_dense_replace"),
            n_shared_experts=opt("n_shared_experts"),
            moe_intermediate=need("moe_intermediate_size"),
            q_lora_rank=c.get("q_lora_rank"),
            kv_lora_rank=need("kv_lora_rank"),
            qk_nope_head_dim=need("qk_nope_head_dim"),
            qk_rope_head_dim=need("qk_rope_head_dim"),
            v_head_dim=need("v_head_dim"),
            moe_layer_freq=opt("moe_layer_freq", 1),
        )
    shared_inter = opt("shared_expert_intermediate_size")
    sparse_step = opt("decoder_sparse_step", 1)
    mlp_only = c.get("mlp_only_layers") or []
    if mlp_only:
        raise ValueError(f"{name}: mlp_only_layers is not supported")
    return ModelSpec(
        **common,
        attention="gqa",
        first_k_dense=0,
        n_shared_experts=1 if shared_inter else 0,
        shared_expert_intermediate=shared_inter,
        moe_intermediate=opt("moe_intermediate_size") or need("intermediate_size"),
        num_kv_heads=opt("num_key_value_heads", heads),
        head_dim=opt("head_dim") or hidden // heads,
        moe_layer_freq=sparse_step,
    )


def read_config(path: str | Path) -> dict[str, Any]:
    """A HF ``config.json`` (the file, or a directory holding one) as a dict; ``ValueError`` if it is not one."""
    p = Path(path) / "config.json" if Path(path).is_dir() else Path(path)
    config = json.loads(p.read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{p}: not a JSON object")
    return config


def vocab_size(config: Mapping[str, Any]) -> int | None:
    """The text model's ``vocab_size`` (top level or ``text_config``), None when the config does not say."""
    tables = (_text_config(config), config)
    return next((int(t["vocab_size"]) for t in tables if isinstance(t.get("vocab_size"), int)), None)


def spec_from_config_file(path: str | Path, name: str | None = None) -> ModelSpec:
    """:func:`spec_from_config` for a ``config.json`` file or a directory holding one."""
    p = Path(path)
    return spec_from_config(read_config(p), name or (p if p.is_dir() else p.parent).name)


# ---------------------------------------------------------------------------------------------------- registry

KIMI_K2_5 = ModelSpec(
    name="kimi-k2.5",
    hidden_size=7168,
    num_layers=61,
    first_k_dense=1,
    dense_intermediate=18432,
    n_routed_experts=384,
    n_shared_experts=1,
    experts_per_token=8,
    moe_intermediate=2048,
    num_heads=64,
    vocab_size=163840,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    expert_weight_bits=4,
    expert_group_size=32,
)

DEEPSEEK_V3 = ModelSpec(
    name="deepseek-v3",
    hidden_size=7168,
    num_layers=61,
    first_k_dense=3,
    dense_intermediate=18432,
    n_routed_experts=256,
    n_shared_experts=1,
    experts_per_token=8,
    moe_intermediate=2048,
    num_heads=128,
    vocab_size=129280,
    q_lora_rank=1536,
    kv_lora_rank=512,
    qk_nope_head_dim=128,
    qk_rope_head_dim=64,
    v_head_dim=128,
    num_mtp_layers=1,
)

MODELS: dict[str, ModelSpec] = {}


def register_model(spec: ModelSpec) -> None:
    """Add (or replace) a spec under ``spec.name``."""
    MODELS[spec.name] = spec


def model_names() -> list[str]:
    return sorted(MODELS)


def get_model(name_or_path: str | Path) -> ModelSpec:
    """A registered spec by name, else a spec read from a ``config.json`` path (file or directory)."""
    key = str(name_or_path)
    if key in MODELS:
        return MODELS[key]
    p = Path(key)
    if p.exists():
        return spec_from_config_file(p)
    raise KeyError(f"unknown model {key!r}: not one of {', '.join(model_names())} and not a config.json path")


register_model(KIMI_K2_5)
register_model(DEEPSEEK_V3)
