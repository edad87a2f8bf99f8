"""Guard of the decode-step budget: Kimi-K2.5 at TP=8, batch 1.

The GEMMs of one decode step are measured here, now, on this machine (each op at M=1, the deployed kind of
kernel where available: INT4 W4A16 for the routed experts, vLLM's fused Marlin MoE when it runs, else per op
(Marlin first), bf16 for the rest); the all-reduce latency at the decode message size comes from this
fingerprint's all-reduce baselines (written by ``suites/allreduce``, read through the baseline store: the
``allreduce_baselines`` fixture, which skips when there are none). The budget
(:mod:`pytest_moeperf.kernels.budget`) gives the GEMM µs per step, measured now and judged lower-is-better
(:func:`~pytest_moeperf.kernels.budget.guard_metrics`), and the all-reduce µs per step, read from the stored
all-reduce baselines (which ``suites/allreduce`` judges) and attached as context, not gated. The all-reduce share
("AllReduce is 51.5 % of decode time") is derived from both and attached as context too: gated, a GEMM speed-up
would raise it and read as a regression.
"""

from __future__ import annotations

import math

import pytest

from pytest_moeperf.kernels import gemm, gemm_measure
from pytest_moeperf.kernels.budget import (
    ROUTED_PREFERENCE,
    AllReducePoint,
    Piece,
    budget_lines,
    build_budget,
    guard_metrics,
    select_points,
)
from pytest_moeperf.kernels.devices import DeviceSpec
from pytest_moeperf.kernels.models import get_model, rank_gemms
from pytest_moeperf.machine.topology import Topology
from pytest_moeperf.perf import Perf

pytestmark = pytest.mark.gemm

MODEL, TP, BATCH = "kimi-k2.5", 8, 1


def _consistent_points(points: list[AllReducePoint], gemm_device: str, topology: Topology) -> list[AllReducePoint]:
    """All-reduce points measured where the GEMMs run: gloo CPU processes with CPU GEMMs, GPU backends with GPU
    GEMMs. A 1-GPU machine has only the gloo stand-in: its share would mix GPU GEMMs with CPU all-reduces."""
    if gemm_device == "cuda" and topology.gpu_count < 2:
        pytest.skip(f"{topology.gpu_count} GPU: the all-reduce baselines here are gloo on CPU processes, and a "
                    "budget of GPU GEMMs plus CPU all-reduces means nothing")
    backends = sorted({p.backend for p in points})
    wanted = ["gloo"] if gemm_device == "cpu" else [b for b in backends if b != "gloo"]
    chosen = select_points(points, TP, backends=wanted)
    if not chosen:
        pytest.skip(f"the all-reduce baselines hold {', '.join(backends)}, none measured on {gemm_device} "
                    "like these GEMMs")
    return chosen


def test_decode_budget(perf: Perf, allreduce_baselines: list[AllReducePoint], topology: Topology,
                       gemm_device: str, device_spec: DeviceSpec) -> None:
    points = _consistent_points(allreduce_baselines, gemm_device, topology)
    spec = get_model(MODEL)
    # The routed experts as vLLM runs them where it can (fused Marlin MoE, one call), else per op.
    fused = gemm.problem_for(spec, TP, gemm.FUSED_MOE_OP, BATCH)
    fused_ok = gemm.unavailable("marlin_moe", fused, gemm_device) is None
    cases = [(fused, ("marlin_moe",))] if fused_ok else []
    for shape in rank_gemms(spec, TP):
        if shape.component == "routed_experts" and fused_ok:
            continue
        impls = ROUTED_PREFERENCE if shape.component == "routed_experts" else ("bf16",)
        cases.append((gemm.problem_for(spec, TP, shape.op, BATCH), impls))
    pieces = []
    for problem, impls in cases:
        impl = next((i for i in impls if gemm.unavailable(i, problem, gemm_device) is None), None)
        assert impl is not None, f"no implementation runs {problem.op} on {gemm_device}"
        timed = gemm_measure.measure(impl, problem, device=gemm_device,
                                     cache_bytes=device_spec.cache_bytes or 0, quick=True)
        pieces.append(Piece(MODEL, TP, problem.op, BATCH, impl, sorted(timed.samples)[len(timed.samples) // 2]))

    budget = build_budget(spec, TP, BATCH, pieces, points)
    print("\n".join(budget_lines(budget)))
    assert not budget.missing, f"budget incomplete: {budget.missing}"
    shares = [r.share_pct for r in budget.rows if r.share_pct is not None]
    assert math.isclose(sum(shares), 100.0, rel_tol=1e-9)

    ar_row = next(r for r in budget.rows if r.component == "all-reduce")
    metrics = guard_metrics(budget)
    derived = {g.name: round(g.value, 3) for g in metrics if not g.gated}
    routed = next(p.impl for p in pieces if p.op in ("gate_up", gemm.FUSED_MOE_OP))
    perf.context(model=MODEL, tp=TP, batch=BATCH, device=device_spec.name, allreduce_source=ar_row.source,
                 allreduce_us=ar_row.each_us, routed_impl=routed, **derived,
                 **({"workload": gemm_measure.CPU_TIMING} if gemm_device == "cpu" else {}))
    for g in metrics:
        if g.gated:
            perf.record(g.name, g.value, unit=g.unit, better="lower" if g.better == "lower" else "higher")
