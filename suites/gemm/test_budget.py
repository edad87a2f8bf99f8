"""Guard of the decode-step budget: Kimi-K2.5 at TP=8, batch 1, the all-reduce share.

The GEMMs of one decode step are measured here, now, on this machine (each op at M=1, the deployed kind of
kernel where available: INT4 W4A16 for the routed experts, bf16 for the rest); the all-reduce latency at the
decode message size comes from this fingerprint's all-reduce baselines (measured by ``suites/allreduce``).
The budget (Σ over layers, :mod:`pytest_moeperf.kernels.budget`) gives the all-reduce share, recorded and compared
against its baseline: the number behind "AllReduce is 51.5 % of decode time".
"""

from __future__ import annotations

import math

import pytest

from pytest_moeperf.kernels import gemm
from pytest_moeperf.kernels.budget import (
    ROUTED_PREFERENCE,
    Piece,
    budget_lines,
    build_budget,
    pieces_from_baselines,
    select_points,
)
from pytest_moeperf.kernels.devices import DeviceSpec
from pytest_moeperf.kernels.models import get_model, rank_gemms
from pytest_moeperf.perf import Perf
from pytest_moeperf.settings import Settings
from pytest_moeperf.topology import Topology

pytestmark = pytest.mark.gemm

MODEL, TP, BATCH = "kimi-k2.5", 8, 1
CPU_TOLERANCE = 0.75  # as test_gemm.CPU_TOLERANCE


def test_decode_budget_allreduce_share(perf: Perf, moeperf_settings: Settings, topology: Topology,
                                       gemm_device: str, device_spec: DeviceSpec) -> None:
    slug = topology.fingerprint.slug
    try:
        _, points = pieces_from_baselines(moeperf_settings.baselines_dir, slug)
    except FileNotFoundError:
        points = []
    points = select_points(points, TP)
    if not points:
        pytest.skip(f"no all-reduce baselines for fingerprint {slug} under {moeperf_settings.baselines_dir}: "
                    "run suites/allreduce with --moeperf-update first")

    spec = get_model(MODEL)
    pieces = []
    for shape in rank_gemms(spec, TP):
        problem = gemm.problem_for(spec, TP, shape.op, BATCH)
        impls = ROUTED_PREFERENCE if shape.component == "routed_experts" else ("bf16",)
        impl = next((i for i in impls if gemm.unavailable(i, problem, gemm_device) is None), None)
        assert impl is not None, f"no implementation runs {shape.op} on {gemm_device}"
        timed = gemm.measure(impl, problem, device=gemm_device, cache_bytes=device_spec.cache_bytes or 0,
                             quick=True)
        pieces.append(Piece(MODEL, TP, shape.op, BATCH, impl, sorted(timed.samples)[len(timed.samples) // 2]))

    budget = build_budget(spec, TP, BATCH, pieces, points)
    print("\n".join(budget_lines(budget)))
    assert not budget.missing, f"budget incomplete: {budget.missing}"
    shares = [r.share_pct for r in budget.rows if r.share_pct is not None]
    assert math.isclose(sum(shares), 100.0, rel_tol=1e-9)
    share = budget.allreduce_share_pct
    assert share is not None and 0.0 < share < 100.0

    ar_row = next(r for r in budget.rows if r.component == "all-reduce")
    perf.context(model=MODEL, tp=TP, batch=BATCH, device=device_spec.name, allreduce_source=ar_row.source,
                 allreduce_us=ar_row.each_us)
    tol = CPU_TOLERANCE if gemm_device == "cpu" else None
    perf.record("allreduce_share_pct", share, unit="%", better="lower", tolerance=tol)
    perf.record("gemm_step_us", budget.total_us - (ar_row.total_us or 0.0), unit="us", better="lower",
                tolerance=tol)
