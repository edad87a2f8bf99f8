"""GEMMs of one decode step, per rank at TP=8: model × op × M × implementation.

Each case builds its weights (several copies when one copy would sit in the last-level cache, so every call
reads cold weights, as in decode), checks copy 0 against a float32 reference, then times:

* GPU: CUDA graph of many back-to-back calls cycling through the copies, events around each replay;
* CPU: wall time of the same calls with ``time.perf_counter_ns``, smaller M.

Metrics: ``time`` (µs per call), ``tflops``, ``weight_gbps`` (weight bytes read per call / time) and, where the
device's datasheet bandwidth is known, ``roofline_pct`` (achieved weight bandwidth / peak).
"""

from __future__ import annotations

import math
import statistics

import pytest

from pytest_moeperf import gemm, timing
from pytest_moeperf.devices import DeviceSpec, roofline_pct
from pytest_moeperf.models import get_model, rank_gemms

DEVICE = gemm.default_device()

pytestmark = pytest.mark.gemm

TP = 8
ROUTED_IMPLS = ("bf16", "grouped", "int4", "marlin", "marlin_moe")
PREFILL_CHUNK = 2048

# GPU: decode batches and one prefill chunk; both models.
GPU_MS = (1, 8, 32, 64, 128, 256, PREFILL_CHUNK)
GPU_QUICK_MS = (1, 64, 256)
GPU_MODELS = ("kimi-k2.5", "deepseek-v3")
# CPU: Kimi's per-rank shapes at small M. Every op at M=1 (what the batch-1 budget needs); experts at larger M
# (routed experts only up to 8: at M=32 a batch touches ~188 experts, ~1.4 GB of bf16 weights per call here).
CPU_OP_MS = {"shared_gate_up": (1, 8, 32), "shared_down": (1, 8, 32), "gate_up": (1, 8), "down": (1, 8)}
CPU_QUICK_MS = (1,)
# torch's CPU _grouped_mm is a per-group fallback (~10 ms per expert on 2 cores): M=1 only.
CPU_GROUPED_MAX_M = 1

# CPU timings on 2 shared cores are noisy; tolerance from the A/A spread measured here (see baselines README).
CPU_TOLERANCE = 0.5
GPU_GRAPH_US = 2000.0  # target duration of one captured graph
GPU_TOTAL_US = 100_000.0  # target timed duration per case


def _cases() -> list[object]:
    params: list[object] = []
    if DEVICE == "cuda":
        for model in GPU_MODELS:
            for shape in rank_gemms(get_model(model), TP):
                impls = ROUTED_IMPLS if shape.op in gemm.ROUTED_OPS else ("bf16",)
                for m in GPU_MS:
                    for impl in impls:
                        params.append(pytest.param(model, shape.op, m, impl, id=f"{model}-{shape.op}-m{m}-{impl}"))
    else:
        for shape in rank_gemms(get_model("kimi-k2.5"), TP):
            impls = ROUTED_IMPLS if shape.op in gemm.ROUTED_OPS else ("bf16",)
            for m in CPU_OP_MS.get(shape.op, (1,)):
                for impl in impls:
                    if impl == "grouped" and m > CPU_GROUPED_MAX_M:
                        continue
                    params.append(pytest.param("kimi-k2.5", shape.op, m, impl, id=f"kimi-k2.5-{shape.op}-m{m}-{impl}"))
    return params


def _quick_skip(quick: bool, device: str, model: str, m: int) -> None:
    if not quick:
        return
    if device == "cuda" and (model != "kimi-k2.5" or m not in GPU_QUICK_MS):
        pytest.skip(f"--moeperf-quick: GPU keeps kimi-k2.5 at M in {GPU_QUICK_MS}")
    if device == "cpu" and m not in CPU_QUICK_MS:
        pytest.skip(f"--moeperf-quick: CPU keeps M in {CPU_QUICK_MS}")


def _time_gpu(built: gemm.Built, quick: bool) -> list[float]:
    fn = timing.cycle(built.calls)
    copies = len(built.calls)
    estimate = statistics.median(timing.time_eager_cuda(fn, iters=max(3, copies), warmup=copies))
    calls = max(copies, min(500, math.ceil(GPU_GRAPH_US / max(estimate, 1e-3))))
    calls = math.ceil(calls / copies) * copies  # every copy equally often
    total = GPU_TOTAL_US / (3 if quick else 1)
    replays = max(10, min(60, math.ceil(total / (estimate * calls))))
    return timing.time_cuda_graph(fn, calls_per_graph=calls, replays=replays, warmup=3)


def _time_cpu(built: gemm.Built, quick: bool) -> list[float]:
    fn = timing.cycle(built.calls)
    return timing.time_cpu(fn, iters=5 if quick else 9, warmup=max(1, len(built.calls)), min_time_s=0.02)


@pytest.mark.parametrize(("model", "op", "m", "impl"), _cases())
def test_gemm(
    perf, moeperf_settings, gemm_device: str, device_spec: DeviceSpec, model: str, op: str, m: int, impl: str
) -> None:
    _quick_skip(moeperf_settings.quick, gemm_device, model, m)
    problem = gemm.problem_for(get_model(model), TP, op, m)
    reason = gemm.unavailable(impl, problem, gemm_device)
    if reason:
        pytest.skip(reason)

    cache = device_spec.cache_bytes or 0
    cap = (16 << 30) if gemm_device == "cuda" else (1 << 30)
    copies = timing.rotation_copies(problem.weight_bytes(impl), cache, factor=2.0, max_total_bytes=cap)
    built = gemm.build(impl, problem, device=gemm_device, copies=copies)
    err = gemm.check(built)  # raises above the tolerance: a wrong kernel is never timed

    samples = _time_gpu(built, moeperf_settings.quick) if gemm_device == "cuda" else _time_cpu(built, moeperf_settings.quick)
    dtype = "int4-w4a16-g32" if impl in ("int4", "marlin", "marlin_moe") else "bf16"
    perf.context(
        model=model, tp=TP, op=op, m=m, impl=impl, dtype=dtype, k=problem.k, n=problem.n,
        experts=len(problem.groups), rows=problem.rows, copies=copies, device=device_spec.name,
        rel_err=float(f"{err:.3g}"),
    )
    tol = CPU_TOLERANCE if gemm_device == "cpu" else None
    wbytes = problem.weight_bytes(impl)
    perf.record("time", samples, unit="us", better="lower", tolerance=tol)
    perf.record("tflops", [problem.flops / (t * 1e6) for t in samples], unit="TFLOP/s", better="higher", tolerance=tol)
    gbps = [wbytes / (t * 1e3) for t in samples]
    perf.record("weight_gbps", gbps, unit="GB/s", better="higher", tolerance=tol)
    if device_spec.has_roofline:
        pct = [roofline_pct(g * 1e9, device_spec) or 0.0 for g in gbps]
        perf.record("roofline_pct", pct, unit="%", better="higher", tolerance=tol)
