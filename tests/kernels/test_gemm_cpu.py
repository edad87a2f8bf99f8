"""A real CPU run of the smallest Kimi TP=8 GEMMs: correctness against float32 and timing that returns samples."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_moeperf.kernels import gemm, timing  # noqa: E402
from pytest_moeperf.kernels.models import KIMI_K2_5  # noqa: E402


@pytest.mark.parametrize("impl", ["bf16", "int4", "grouped"])
def test_routed_gate_up_m1_runs_and_is_correct(impl: str) -> None:
    problem = gemm.problem_for(KIMI_K2_5, 8, "gate_up", 1)
    assert problem.groups == (1,) * 8 and (problem.k, problem.n) == (7168, 512)
    reason = gemm.unavailable(impl, problem, "cpu")
    if reason:
        pytest.skip(reason)
    timed = gemm.measure(impl, problem, device="cpu", cache_bytes=0, quick=True)
    assert timed.rel_err < gemm.TOLERANCE[impl]
    assert len(timed.samples) == 5 and all(t > 0 for t in timed.samples)


def test_check_catches_a_wrong_kernel() -> None:
    problem = gemm.problem_for(KIMI_K2_5, 8, "shared_down", 2)
    built = gemm.build("bf16", problem, device="cpu")
    built.output = lambda: torch.zeros(problem.rows, problem.n)  # a kernel that writes nothing useful
    with pytest.raises(AssertionError, match="relative error"):
        gemm.check(built)


def test_unwritten_output_is_nan_poisoned(monkeypatch: pytest.MonkeyPatch) -> None:
    problem = gemm.problem_for(KIMI_K2_5, 8, "shared_down", 1)
    built = gemm.build("bf16", problem, device="cpu")
    monkeypatch.setattr(torch, "mm", lambda *args, **kwargs: None)  # a kernel that never stores its result
    with pytest.raises(AssertionError, match="relative error inf"):
        gemm.check(built)


def test_routing_is_seeded_and_counts_pairs() -> None:
    a = gemm.routed_groups(KIMI_K2_5, 16, seed=3)
    assert a == gemm.routed_groups(KIMI_K2_5, 16, seed=3)
    assert sum(a) == 16 * 8 and all(g >= 1 for g in a) and len(a) <= 128


def test_time_cpu_calibrates_loops() -> None:
    samples = timing.time_cpu(lambda: sum(range(50)), iters=4, warmup=1, min_time_s=0.002)
    assert len(samples) == 4 and all(0 < s < 2000 for s in samples)
    assert timing.rotation_copies(7 << 20, 32 << 20) == 10
    assert timing.rotation_copies(1 << 30, 32 << 20) == 1
    calls: list[int] = []
    fn = timing.cycle([lambda: calls.append(0), lambda: calls.append(1)])
    for _ in range(3):
        fn()
    assert calls == [0, 1, 0]
