"""A real CPU run of the smallest Kimi TP=8 GEMMs: correctness against float32 and timing that returns samples."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from pytest_moeperf.kernels import gemm, gemm_measure, timing  # noqa: E402
from pytest_moeperf.kernels.models import KIMI_K2_5  # noqa: E402


@pytest.mark.parametrize("impl", ["bf16", "int4", "grouped"])
def test_routed_gate_up_m1_runs_and_is_correct(impl: str) -> None:
    problem = gemm.problem_for(KIMI_K2_5, 8, "gate_up", 1)
    assert problem.groups == (1,) * 8 and (problem.k, problem.n) == (7168, 512)
    reason = gemm.unavailable(impl, problem, "cpu")
    if reason:
        pytest.skip(reason)
    timed = gemm_measure.measure(impl, problem, device="cpu", cache_bytes=0, quick=True, span_s=0.5)
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


def test_time_cpu_spread_keeps_a_burst_out_of_every_sample() -> None:
    # A neighbour's burst slows the first 30 calls by half. Adjacent best-of-3 batches (time_cpu) all sit inside it;
    # batches spread across the span give every sample one outside it. The clock is the fake's: what it times is
    # the arithmetic of spreading, not this machine.
    now, calls = [0], [0]

    def fn() -> None:
        calls[0] += 1
        now[0] += 1_500_000 if calls[0] <= 30 else 1_000_000

    def fake(**kw: float) -> list[float]:
        now[0] = calls[0] = 0
        return timing.time_cpu_spread(fn, samples=5, best_of=3, warmup=0, min_time_s=0.005, clock=lambda: now[0],
                                      wall=lambda: now[0] / 1e9, **kw)

    assert fake(span_s=0.2) == [1000.0] * 5
    assert now[0] >= 0.2e9  # batches ran until the span had passed
    assert len(fake(span_s=0.0)) == 5 and calls[0] == 7 + 15 * 4 - 4  # no span: samples x best_of batches, no more
    now[0] = calls[0] = 0
    adjacent = timing.time_cpu(fn, iters=15, warmup=0, min_time_s=0.005, clock=lambda: now[0])
    assert min(adjacent[:3]) == 1500.0  # the first best-of-3 of adjacent batches reads the burst
    with pytest.raises(ValueError, match="span_s"):
        fake(span_s=float("nan"))


@pytest.mark.parametrize("impl", ["bf16", "int4", "grouped"])
def test_weight_bytes_are_what_the_kernel_is_handed(impl: str) -> None:
    # Defect 4: int4 bytes left out the zero-point half of torch's scales_and_zeros ([K/group, N, 2] bf16), so
    # int4 bandwidth and roofline read ~10 % low. The count must equal the bytes of the tensors one call reads.
    problem = gemm.problem_for(KIMI_K2_5, 8, "down", 1)
    reason = gemm.unavailable(impl, problem, "cpu")
    if reason:
        pytest.skip(reason)
    built = gemm.build(impl, problem, device="cpu")
    assert built.bytes_read > 0 and problem.weight_bytes(impl) == built.bytes_read


def test_int4_and_marlin_count_their_own_group_data() -> None:
    problem = gemm.problem_for(KIMI_K2_5, 8, "gate_up", 1)
    nibbles = problem.k * problem.n // 2 * 8
    scales = problem.k // 32 * problem.n * 2 * 8
    assert problem.weight_bytes("marlin") == nibbles + scales  # symmetric uint4b8: scales only
    assert problem.weight_bytes("int4") == nibbles + 2 * scales  # scale and zero point per group


def test_fused_moe_problem_and_skip_reasons_on_cpu() -> None:
    problem = gemm.problem_for(KIMI_K2_5, 8, gemm.FUSED_MOE_OP, 1)
    assert (problem.k, problem.n, problem.matrices) == (7168, 256, 3) and problem.groups == (1,) * 8
    assert problem.flops == 2 * 8 * (7168 * 512 + 256 * 7168)
    assert "CUDA-only" in (gemm.unavailable("marlin_moe", problem, "cpu") or "")
    assert "marlin_moe alone" in (gemm.unavailable("bf16", problem, "cpu") or "")
    per_op = gemm.problem_for(KIMI_K2_5, 8, "gate_up", 1)
    assert "marlin_moe alone" in (gemm.unavailable("marlin_moe", per_op, "cuda") or "")


def test_gptq_pack_round_trips() -> None:
    from pytest_moeperf.kernels.marlin import gptq_pack

    q = torch.randint(0, 16, (64, 24), dtype=torch.int32, generator=torch.Generator().manual_seed(1))
    packed = gptq_pack(q)
    assert packed.shape == (8, 24) and packed.dtype == torch.int32
    words = packed.to(torch.int64) & 0xFFFFFFFF
    unpacked = torch.stack([(words >> (4 * j)) & 0xF for j in range(8)], dim=1).reshape(64, 24)
    assert torch.equal(unpacked.to(torch.int32), q)
