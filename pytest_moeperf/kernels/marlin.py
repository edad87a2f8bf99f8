"""vLLM's Marlin W4A16 kernels, built from random int4 weights and checked against a dequantised reference.

* ``marlin``: one ``marlin_gemm`` per group. The weight is quantised here (symmetric, group 32, ``uint4b8``: stored
  ``q`` means ``q − 8``), packed in GPTQ order (``[K/8, N]`` int32, eight K-rows per word) and repacked into
  Marlin's tile layout by ``gptq_marlin_repack``; scales are permuted by vLLM's ``marlin_permute_scales``.
* ``marlin_moe``: vLLM's ``fused_marlin_moe`` over all the model's routed experts of one rank (gate_up +
  SiLU-and-mul + down + weighted top-k sum in one call), tokens routed by
  :func:`~pytest_moeperf.kernels.gemm.routed_ids`. Reference: the same in float32 on the dequantised weights.

vLLM's Python wrappers are called by keyword, filtered by their signatures, so a parameter renamed or added
across vLLM releases is left at its default (or ``None``); an API this module does not recognise raises
:class:`~pytest_moeperf.kernels.gemm.Unavailable` (the case skips, saying why). Written against vLLM 0.26.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from pytest_moeperf.kernels.gemm import (
    INT4_GROUP,
    Built,
    Problem,
    Unavailable,
    per_group_built,
    quantize_int4,
    routed_ids,
    slices,
)
from pytest_moeperf.kernels.models import get_model

if TYPE_CHECKING:
    import torch

__all__ = ["build_fused_moe", "build_marlin", "call_by_name", "find_fused_marlin_moe", "gptq_pack"]

_VLLM_ERRORS = (ImportError, KeyError, TypeError, AttributeError, ValueError, RuntimeError, AssertionError)


def call_by_name(fn: Callable[..., Any], values: Mapping[str, Any]) -> Any:
    """``fn(**kwargs)``: each parameter of ``fn`` named in ``values`` gets that value; a parameter without a default
    that ``values`` does not name gets ``None``; the rest keep their defaults."""
    kwargs: dict[str, Any] = {}
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        if name in values:
            kwargs[name] = values[name]
        elif param.default is inspect.Parameter.empty:
            kwargs[name] = None
    return fn(**kwargs)


def find_fused_marlin_moe() -> Callable[..., Any]:
    """vLLM's ``fused_marlin_moe``: where releases have kept it (``fused_moe.fused_marlin_moe``, or exported by
    the ``fused_moe`` package), else the first module of ``fused_moe`` whose name contains "marlin" and that
    defines it. ``ImportError`` naming the places searched."""
    import importlib
    import pkgutil

    pkg = importlib.import_module("vllm.model_executor.layers.fused_moe")
    found = getattr(pkg, "fused_marlin_moe", None)
    names = [f"{pkg.__name__}.fused_marlin_moe"]
    names += [i.name for i in pkgutil.walk_packages(pkg.__path__, pkg.__name__ + ".")
              if "marlin" in i.name.rsplit(".", 1)[-1] and i.name not in names]
    for name in names:
        if callable(found):
            return found  # type: ignore[no-any-return]
        try:
            found = getattr(importlib.import_module(name), "fused_marlin_moe", None)
        except Exception:  # noqa: BLE001 - a module that does not import is one place it is not
            found = None
    if callable(found):
        return found  # type: ignore[no-any-return]
    raise ImportError(f"no fused_marlin_moe in {pkg.__name__} or its modules {', '.join(names)}")


def gptq_pack(q: torch.Tensor) -> torch.Tensor:
    """GPTQ packing of 4-bit values ``q`` ``[K, N]`` (0..15): ``[K/8, N]`` int32, row ``8i + j`` in bits ``4j``."""
    import torch

    k, n = q.shape
    parts = q.to(torch.int64).reshape(k // 8, 8, n)
    packed = torch.zeros(k // 8, n, dtype=torch.int64, device=q.device)
    for j in range(8):
        packed |= parts[:, j, :] << (4 * j)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # the same 32 bits, as int32
    return packed.to(torch.int32)


class _Vllm:
    """The vLLM entry points used here, looked up once per build."""

    def __init__(self, device: torch.device) -> None:
        import torch
        from vllm import _custom_ops as ops  # type: ignore[import-not-found, unused-ignore]
        from vllm.model_executor.layers.quantization.utils import (  # type: ignore[import-not-found, unused-ignore]
            marlin_utils,
        )
        from vllm.scalar_type import scalar_types  # type: ignore[import-not-found, unused-ignore]

        self.ops = ops
        self.quant_type = scalar_types.uint4b8
        self.permute_scales: Callable[..., torch.Tensor] = marlin_utils.marlin_permute_scales
        ops_vars = vars(ops)
        self.gemm: Callable[..., torch.Tensor] = ops_vars.get("marlin_gemm") or ops_vars["gptq_marlin_gemm"]
        self.repack_fn: Callable[..., torch.Tensor] = ops_vars["gptq_marlin_repack"]
        self.empty = torch.empty(0, dtype=torch.int32, device=device)
        make = getattr(marlin_utils, "marlin_make_workspace_new", None)
        sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.workspace = make(device, 4) if make else torch.zeros(sms * 4, dtype=torch.int32, device=device)

    def repack(self, q: torch.Tensor, s: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``q`` [K, N] (0..15) and scales [K/32, N] → Marlin weight and scales for ``marlin_gemm``."""
        k, n = q.shape
        packed = call_by_name(self.repack_fn, {"b_q_weight": gptq_pack(q), "perm": self.empty, "size_k": k,
                                               "size_n": n, "num_bits": 4, "is_a_8bit": False})
        scales = self.permute_scales(s.to(dtype=_bf16()).contiguous(), size_k=k, size_n=n, group_size=INT4_GROUP)
        return packed, scales


def _bf16() -> torch.dtype:
    import torch

    return torch.bfloat16


def build_marlin(problem: Problem, x: torch.Tensor, weights: list[list[torch.Tensor]], device: str) -> Built:
    """``marlin_gemm`` per group (per touched expert for the routed ops), one weight set per copy."""
    try:
        v = _Vllm(x.device)
        copies: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
        dequant0: list[torch.Tensor] = []
        for ci, ws in enumerate(weights):
            packed_set = []
            for w in ws:
                q, scale, deq = quantize_int4(w)  # q [N, K], scale [K/32, N]
                if ci == 0:
                    dequant0.append(deq)
                packed_set.append(v.repack(q.t().contiguous(), scale))
            copies.append(packed_set)

        def gemm(a: torch.Tensor, qw: torch.Tensor, s: torch.Tensor) -> Any:
            return call_by_name(v.gemm, {
                "a": a, "c": None, "b_q_weight": qw, "b_bias": None, "b_scales": s, "b_zeros": None,
                "g_idx": None, "perm": None, "workspace": v.workspace, "b_q_type": v.quant_type,
                "size_m": a.shape[0], "size_n": problem.n, "size_k": problem.k, "is_k_full": True,
                "use_atomic_add": False, "use_fp32_reduce": True, "is_zp_float": False,
            })

        def run(packed_set: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], list[torch.Tensor]]:
            pairs = list(zip(slices(x, problem.groups), packed_set, strict=True))
            return lambda: [gemm(xi, qw, s) for xi, (qw, s) in pairs]  # Any: vLLM is untyped here

        read = sum(t.numel() * t.element_size() for pair in copies[0] for t in pair)
        built = per_group_built("marlin", problem, [run(ps) for ps in copies], x, dequant0, read)
        built.output()  # an API mismatch shows here, before any timing
    except _VLLM_ERRORS as exc:
        raise Unavailable(f"vLLM Marlin API not as this suite expects: {exc!r}") from exc
    return built


def build_fused_moe(problem: Problem, *, device: str, copies: int = 1, seed: int = 0) -> Built:
    """``fused_marlin_moe`` on every routed expert of one rank (``E`` experts, K = hidden, N = intermediate per
    rank), ``copies`` copies of the expert weights (for rotation), tokens routed as :func:`routed_ids`."""
    import torch

    spec = get_model(problem.model)
    n_exp, k, n, m = spec.n_routed_experts, problem.k, problem.n, problem.m
    try:
        fused_marlin_moe = find_fused_marlin_moe()
        v = _Vllm(torch.device(device))
        gen = torch.Generator(device=device).manual_seed(seed)
        x = torch.randn(m, k, generator=gen, device=device).to(torch.bfloat16)
        ids = torch.tensor(routed_ids(spec, m, seed=problem.seed), dtype=torch.int32, device=device)
        topk_weights = torch.softmax(torch.randn(ids.shape, generator=gen, device=device), dim=-1)
        w1q: list[torch.Tensor] = []
        w1s: list[torch.Tensor] = []
        w2q: list[torch.Tensor] = []
        w2s: list[torch.Tensor] = []
        deq: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        touched = set(ids.flatten().tolist())
        template: tuple[torch.Tensor, ...] | None = None
        for e in range(n_exp):  # gate_up [2N, K] (gate rows first, as silu_and_mul reads them), down [K, N]
            if e not in touched and template is not None:
                parts = template  # never read by this routing: its own memory, a built expert's values
            else:
                w13 = (torch.randn(2 * n, k, generator=gen, device=device) / math.sqrt(k)).to(torch.bfloat16)
                w2 = (torch.randn(k, n, generator=gen, device=device) / math.sqrt(n)).to(torch.bfloat16)
                q13, s13, d13 = quantize_int4(w13)
                q2, s2, d2 = quantize_int4(w2)
                deq[e] = (d13, d2)
                parts = (*v.repack(q13.t().contiguous(), s13), *v.repack(q2.t().contiguous(), s2))
                template = template or parts
            for dest, part in zip((w1q, w1s, w2q, w2s), parts, strict=True):
                dest.append(part)
        base = [torch.stack(t) for t in (w1q, w1s, w2q, w2s)]
        sets = [base] + [[t.clone() for t in base] for _ in range(copies - 1)]

        def make(w1: torch.Tensor, s1: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor) -> Callable[[], torch.Tensor]:
            values = {
                "hidden_states": x, "w1": w1, "w2": w2, "bias1": None, "bias2": None, "w1_scale": s1,
                "w2_scale": s2, "gating_output": None, "topk_weights": topk_weights, "topk_ids": ids,
                "quant_type_id": v.quant_type.id, "quant_type": v.quant_type, "num_bits": 4,
                "global_num_experts": n_exp, "expert_map": None, "workspace": v.workspace, "is_k_full": True,
                "apply_router_weight_on_input": False,
            }
            return lambda: call_by_name(fused_marlin_moe, values)

        calls = [make(*ws) for ws in sets]

        def reference() -> torch.Tensor:
            out = torch.zeros(m, k, device=device)
            for t in range(m):
                for j, e in enumerate(ids[t].tolist()):
                    d13, d2 = deq[e]
                    h = x[t].float() @ d13.float().t()
                    act = torch.nn.functional.silu(h[:n]) * h[n:]
                    out[t] += topk_weights[t, j] * (act @ d2.float().t())
            return out

        per_expert = sum(t[0].numel() * t[0].element_size() for t in base)  # packed weights + scales
        built = Built("marlin_moe", problem, calls, reference, calls[0], per_expert * len(touched))
        built.output()  # an API mismatch shows here, before any timing
    except _VLLM_ERRORS as exc:
        raise Unavailable(f"vLLM fused Marlin MoE API not as this suite expects: {exc!r}") from exc
    return built
