"""GEMM problems of a model's decode step and the implementations that run them, with a correctness check.

A :class:`Problem` is one op of one layer at ``m`` tokens: a ``K → N`` weight per *group* and the number of
activation rows each group multiplies. A plain linear layer is one group of ``m`` rows; the routed experts
(``gate_up``/``down``) are one group per expert the batch touches, rows = (token, expert) pairs, from a seeded
uniform top-k routing (:func:`routed_groups`).

Implementations (``IMPLS``, by name):

* ``bf16``    ``torch.mm`` per group into a NaN-poisoned output (one call for a plain GEMM);
* ``grouped`` ``torch._grouped_mm`` over all groups in one call (bf16);
* ``int4``    W4A16: torch's int4 weight-only kernel (``_weight_int4pack_mm``, symmetric, group 32), per group;
* ``marlin`` / ``marlin_moe``: vLLM's Marlin W4A16 GEMM / fused Marlin MoE, when vLLM is importable on CUDA.

:func:`build` makes ``copies`` independent weight sets (for rotation past the cache), and :func:`check`
compares copy 0 against a float32 reference of the same (for int4: dequantised) weights by relative Frobenius
error. Weights are ``randn / sqrt(K)``, activations ``randn``: never zeros.
"""

from __future__ import annotations

import importlib.util
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pytest_moeperf.kernels.models import GemmShape, ModelSpec, rank_gemms

if TYPE_CHECKING:
    import torch

__all__ = [
    "Built",
    "IMPLS",
    "Problem",
    "TOLERANCE",
    "Unavailable",
    "build",
    "check",
    "measure",
    "Timed",
    "default_device",
    "problem_for",
    "relative_error",
    "routed_groups",
    "unavailable",
]

#: Relative Frobenius error allowed against the float32 reference, per implementation.
TOLERANCE: dict[str, float] = {"bf16": 1e-2, "grouped": 1e-2, "int4": 2e-2, "marlin": 2e-2, "marlin_moe": 2e-2}
IMPLS: tuple[str, ...] = ("bf16", "grouped", "int4", "marlin", "marlin_moe")
INT4_GROUP = 32
ROUTED_OPS = ("gate_up", "down")
MARLIN_MOE_NOT_WIRED = (
    "fused Marlin MoE runs gate_up + activation + down in one call; this per-op suite does not build it yet"
)


@dataclass(frozen=True)
class Problem:
    model: str
    op: str
    m: int
    k: int
    n: int
    groups: tuple[int, ...]  # activation rows per weight matrix

    @property
    def rows(self) -> int:
        return sum(self.groups)

    @property
    def flops(self) -> int:
        return 2 * self.rows * self.k * self.n

    def weight_bytes(self, impl: str) -> int:
        """Weight bytes one call reads: bf16, or int4 nibbles + bf16 group scales."""
        per = self.k * self.n * 2
        if impl in ("int4", "marlin", "marlin_moe"):
            per = self.k * self.n // 2 + (self.k // INT4_GROUP) * self.n * 2
        return per * len(self.groups)


def default_device() -> str:
    """``"cuda"`` when torch sees a GPU, ``"cpu"`` when torch is CPU-only, ``"none"`` without torch."""
    try:
        import torch
    except ImportError:
        return "none"
    return "cuda" if torch.cuda.is_available() else "cpu"


def routed_groups(spec: ModelSpec, m: int, *, seed: int = 0) -> tuple[int, ...]:
    """Rows per touched expert for ``m`` tokens, each routed to ``experts_per_token`` distinct experts drawn
    uniformly with a fixed seed (sorted by expert id, untouched experts left out)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    counts = [0] * spec.n_routed_experts
    for _ in range(m):
        for e in torch.randperm(spec.n_routed_experts, generator=gen)[: spec.experts_per_token].tolist():
            counts[e] += 1
    return tuple(c for c in counts if c)


def problem_for(spec: ModelSpec, tp: int, op: str, m: int, *, seed: int = 0) -> Problem:
    """The :class:`Problem` of ``op`` (a :func:`~pytest_moeperf.kernels.models.rank_gemms` op name) at ``m`` tokens."""
    shapes: dict[str, GemmShape] = {s.op: s for s in rank_gemms(spec, tp)}
    if op not in shapes:
        raise KeyError(f"{spec.name} at tp={tp} has no op {op!r}; ops: {', '.join(shapes)}")
    s = shapes[op]
    groups = routed_groups(spec, m, seed=seed) if op in ROUTED_OPS else (m,)
    return Problem(spec.name, op, m, s.k, s.n, groups)


def unavailable(impl: str, problem: Problem, device: str) -> str | None:
    """Why ``impl`` cannot run ``problem`` on ``device`` (``"cpu"`` or ``"cuda"``), or ``None`` if it can."""
    import torch

    if impl not in IMPLS:
        return f"unknown implementation {impl!r}"
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
            return "vLLM Marlin kernels are CUDA-only"
        if importlib.util.find_spec("vllm") is None:
            return "vLLM is not importable here"
        if impl == "marlin_moe":
            return MARLIN_MOE_NOT_WIRED
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
        "marlin": _build_marlin,
        "marlin_moe": _build_marlin_moe,
    }
    return makers[impl](problem, x, weights, device)


@dataclass(frozen=True)
class Timed:
    """A checked and timed case: per-call µs samples, copies rotated through, relative error of copy 0."""

    samples: list[float]
    copies: int
    rel_err: float
    threads: int | None  # CPU: torch intra-op threads used; None on GPU


#: GPU: target duration of one captured graph and of all timed replays of a case.
GPU_GRAPH_US = 2000.0
GPU_TOTAL_US = 100_000.0
#: CPU: one intra-op thread. On a small shared machine, OpenMP threads that spin waiting for a core another
#: process holds turn a 1 ms GEMM into 10 ms; one thread is slower but far steadier.
CPU_THREADS = 1
#: CPU: each sample is the best of this many consecutive timed batches; other processes only ever add time.
CPU_BEST_OF = 3
#: CPU clock: the calling thread's CPU time. With one intra-op thread the GEMM runs on the calling thread, so
#: time other processes hold the cores is not counted (wall time moved by up to 3x between runs on a shared
#: 2-core box). Cache and memory-bandwidth contention still count.
CPU_CLOCK = time.thread_time_ns
CPU_CLOCK_NAME = "thread_time"


def measure(impl: str, problem: Problem, *, device: str, cache_bytes: int, quick: bool = False,
            max_total_bytes: int | None = None) -> Timed:
    """Build ``impl`` for ``problem`` with enough weight copies to exceed ``2 × cache_bytes``, check it
    (:func:`check` raises above the tolerance: a wrong kernel is never timed), then time it: on CUDA a graph
    of back-to-back calls cycling through the copies (:func:`~pytest_moeperf.kernels.timing.time_cuda_graph`, sized
    from an eager estimate to ~2 ms per graph and ~100 ms in all), on CPU
    :func:`~pytest_moeperf.kernels.timing.time_cpu` with :data:`CPU_THREADS` intra-op threads on the :data:`CPU_CLOCK`
    (thread CPU time), each sample the best of :data:`CPU_BEST_OF` batches of calls lasting >= 10 ms."""
    import torch

    from pytest_moeperf.kernels import timing

    cap = max_total_bytes if max_total_bytes is not None else ((16 << 30) if device == "cuda" else (1 << 30))
    copies = timing.rotation_copies(problem.weight_bytes(impl), cache_bytes, factor=2.0, max_total_bytes=cap)
    if device == "cpu":
        previous = torch.get_num_threads()
        torch.set_num_threads(CPU_THREADS)
        try:
            built = build(impl, problem, device=device, copies=copies)
            err = check(built)
            fn = timing.cycle(built.calls)
            n = 5 if quick else 7
            raw = timing.time_cpu(fn, iters=n * CPU_BEST_OF, warmup=copies, min_time_s=0.01, clock=CPU_CLOCK)
            samples = [min(raw[i:i + CPU_BEST_OF]) for i in range(0, len(raw), CPU_BEST_OF)]
        finally:
            torch.set_num_threads(previous)
        return Timed(samples, copies, err, CPU_THREADS)
    built = build(impl, problem, device=device, copies=copies)
    err = check(built)
    fn = timing.cycle(built.calls)
    estimate = sorted(timing.time_eager_cuda(fn, iters=max(3, copies), warmup=copies))[max(3, copies) // 2]
    calls = max(copies, min(500, math.ceil(GPU_GRAPH_US / max(estimate, 1e-3))))
    calls = math.ceil(calls / copies) * copies  # every copy equally often
    total = GPU_TOTAL_US / (3 if quick else 1)
    replays = max(10, min(60, math.ceil(total / (estimate * calls))))
    samples = timing.time_cuda_graph(fn, calls_per_graph=calls, replays=replays, warmup=3)
    del built, fn
    torch.cuda.empty_cache()
    return Timed(samples, copies, err, None)


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
    xs = _slices(x, problem.groups)

    def make(ws: list[torch.Tensor], out: torch.Tensor) -> Callable[[], torch.Tensor]:
        pairs = [(xi, w.t(), out[s:e]) for xi, w, (s, e) in zip(xs, ws, bounds, strict=True)]

        def call() -> torch.Tensor:
            for xi, wt, o in pairs:
                torch.mm(xi, wt, out=o)
            return out

        return call

    calls = [make(ws, out) for ws, out in zip(weights, outs, strict=True)]
    return Built("bf16", problem, calls, lambda: _reference(x, weights[0], problem.groups), calls[0])


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
    return Built("grouped", problem, calls, lambda: _reference(x, weights[0], problem.groups), calls[0])


def _quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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
            q, scale, deq = _quantize_int4(w)
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
        pairs = list(zip(_slices(x, problem.groups), packed_set, strict=True))
        return lambda: [mm(xi, p, INT4_GROUP, sz) for xi, (p, sz) in pairs]

    return _per_group_built("int4", problem, [run(ps) for ps in copies], x, dequant0)


def _slices(x: torch.Tensor, groups: Sequence[int]) -> list[torch.Tensor]:
    return [x[s:e] for s, e in _offsets(groups)]


def _per_group_built(
    impl: str,
    problem: Problem,
    runs: list[Callable[[], list[torch.Tensor]]],
    x: torch.Tensor,
    ref_weights: list[torch.Tensor],
) -> Built:
    """A :class:`Built` for implementations that return one fresh output per group."""
    import torch

    return Built(
        impl,
        problem,
        list(runs),
        lambda: _reference(x, ref_weights, problem.groups),
        lambda: torch.cat(runs[0]()),
    )


class Unavailable(RuntimeError):
    """An implementation turned out not to run here (e.g. a vLLM API this suite does not know): skip, not fail."""


def _vllm_marlin_error(exc: BaseException) -> Unavailable:
    return Unavailable(f"vLLM Marlin API not as this suite expects: {exc!r}")


def _build_marlin(problem: Problem, x: torch.Tensor, weights: list[list[torch.Tensor]], device: str) -> Built:
    """W4A16 Marlin per group: vLLM's quantise-and-repack helper (``marlin_quantize``) and ``gptq_marlin_gemm``,
    called by keyword so that optional parameters added across vLLM versions stay ``None``."""
    import inspect

    try:
        from vllm import _custom_ops as ops  # type: ignore[import-not-found, unused-ignore]
        from vllm.model_executor.layers.quantization.utils.marlin_utils import (  # type: ignore[import-not-found, unused-ignore]
            marlin_make_workspace_new,
        )
        from vllm.model_executor.layers.quantization.utils.marlin_utils_test import (  # type: ignore[import-not-found, unused-ignore]
            marlin_quantize,
        )
        from vllm.scalar_type import scalar_types  # type: ignore[import-not-found, unused-ignore]

        # Looked up dynamically: present only in CUDA builds, signature varies across vLLM versions.
        gptq_marlin_gemm: Callable[..., torch.Tensor] = vars(ops)["gptq_marlin_gemm"]
        quantize: Callable[..., list[torch.Tensor]] = marlin_quantize
        workspace = marlin_make_workspace_new(x.device)
        quant = scalar_types.uint4b8
        params = inspect.signature(gptq_marlin_gemm).parameters
        takes_act_order = "act_order" in inspect.signature(marlin_quantize).parameters
        copies: list[list[dict[str, object]]] = []
        dequant0: list[torch.Tensor] = []
        for ci, ws in enumerate(weights):
            packed_set = []
            for w in ws:
                extra = {"act_order": False} if takes_act_order else {}
                res = quantize(w.t().contiguous(), quant, INT4_GROUP, **extra)
                w_ref, q_w, s = res[0], res[1], res[2]
                g_idx, sort_idx = (res[3], res[4]) if len(res) >= 5 else (None, None)
                if ci == 0:
                    dequant0.append(w_ref.t().contiguous())
                empty = inspect.Parameter.empty
                kwargs: dict[str, object] = {
                    name: None for name, p in params.items() if p.default is empty or p.default is None
                }
                kwargs.update(
                    b_q_weight=q_w, b_scales=s, g_idx=g_idx, perm=sort_idx, workspace=workspace, b_q_type=quant,
                    size_n=problem.n, size_k=problem.k,
                )
                kwargs.pop("a", None)
                kwargs.pop("size_m", None)
                packed_set.append(kwargs)
            copies.append(packed_set)

        def run(packed_set: list[dict[str, object]]) -> Callable[[], list[torch.Tensor]]:
            pairs = list(zip(_slices(x, problem.groups), packed_set, strict=True))
            return lambda: [gptq_marlin_gemm(a=xi, size_m=xi.shape[0], **kw) for xi, kw in pairs]

        built = _per_group_built("marlin", problem, [run(ps) for ps in copies], x, dequant0)
        built.output()
    except (ImportError, KeyError, TypeError, AttributeError, ValueError, RuntimeError, AssertionError) as exc:
        raise _vllm_marlin_error(exc) from exc
    return built


def _build_marlin_moe(problem: Problem, x: torch.Tensor, weights: list[list[torch.Tensor]], device: str) -> Built:
    raise Unavailable(MARLIN_MOE_NOT_WIRED)
