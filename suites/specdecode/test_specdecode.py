"""Speculative decoding: does a draft pay for itself? Acceptance and TPOT speedup per candidate and concurrency.

Every profile (the no-speculation reference and each draft candidate) decodes the same bundled prompt set with
natural repetition (``ignore_eos``, fixed output length) at each concurrency. A candidate's acceptance comes from
vLLM's spec-decode counters over exactly its measured window; its speedup is the reference's median TPOT over
its own, same model, build and workload. Thresholds (minimum acceptance length and speedup) live in the
candidate's profile; the comparison table of candidates is in the reports. The speedup test alternates
reference and candidate windows on the same prompts, so that both see the same state of a shared machine, and
uses the engine's TPOT (``vllm:request_time_per_output_token_seconds``, engine-core timestamps): the client's
TPOT collapses when a lagging API server sends a whole answer in one SSE chunk, which a busy CPU box does.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.serving.loadgen import ClosedLoop
from pytest_moeperf.serving.metrics import latency_samples, percentile
from pytest_moeperf.serving.plugin import ServerPool
from pytest_moeperf.serving.recording import PerfRecorder, check_failures, record_acceptance
from pytest_moeperf.serving.served import Served, SpecWindow
from pytest_moeperf.serving.specdecode import speedup
from pytest_moeperf.settings import Settings

# Per-request latencies spread with the workload (queueing, prompt mix), not with run-to-run noise: judge them
# against the profile's tolerance (chosen from an A/A rerun on that box), not against a multiple of their IQR.
pytestmark = [pytest.mark.specdecode, pytest.mark.moeperf_threshold(noise_k=0.0)]

PROMPTS = Path(__file__).parent / "prompts" / "repetitive.json"


@dataclass(frozen=True)
class Workload:
    requests: int
    output_len: int
    warmup: int


WORKLOADS = {"cpu": Workload(requests=24, output_len=96, warmup=2), "cuda": Workload(200, 256, 8)}

CPU_CANDIDATES = ["cpu-tiny-nospec", "cpu-tiny-ngram"]
GPU_CANDIDATES = [
    "kimi-k25-tp8-nospec",
    "kimi-k25-tp8-ngram",
    "kimi-k25-tp8-eagle3-aqmedai",
    "kimi-k25-tp8-eagle3-lightseek",
    "kimi-k25-tp8-draft-moonlight",
]
PLAN = [pytest.param(p, c, id=f"{p}-c{c}") for p in CPU_CANDIDATES for c in (1, 4)] + [
    pytest.param(p, c, id=f"{p}-c{c}") for p in GPU_CANDIDATES for c in (1, 8, 32)
]
SPECULATIVE_PLAN = [p for p in PLAN if "nospec" not in str(p.values[0])]


def decode_window(served: Served, concurrency: int, quick: bool) -> SpecWindow:
    wl = WORKLOADS[served.profile.device]
    count = max(8, wl.requests // 2) if quick else wl.requests
    requests = served.prompt_set(PROMPTS, count + wl.warmup, wl.output_len, seed=0)
    return served.measure(requests[wl.warmup :], ClosedLoop(concurrency), warmup=requests[: wl.warmup])


def tpot_ms(window: SpecWindow) -> float:
    """The engine's mean TPOT over the window when the server exports it, else the client's median TPOT."""
    if window.engine_tpot_ms is not None:
        return window.engine_tpot_ms
    return percentile(latency_samples(window.window.outcomes)["tpot"], 50.0)


def describe(perf: PerfRecorder, served: Served, concurrency: int) -> None:
    spec = served.profile.speculative or {}
    perf.context(
        profile=served.profile.name,
        model=served.profile.model,
        spec_method=served.profile.method,
        draft=str(spec.get("model", "")) or None,
        num_speculative_tokens=int(spec["num_speculative_tokens"]) if "num_speculative_tokens" in spec else None,
        concurrency=concurrency,
        workload=PROMPTS.name,
    )


@pytest.mark.parametrize(("served", "concurrency"), PLAN, indirect=["served"])
def test_decode(
    served: Served,
    concurrency: int,
    perf: PerfRecorder,
    moeperf_settings: Settings,
) -> None:
    """TPOT, ITL, TTFT and output throughput of the profile; acceptance figures when it speculates."""
    result = decode_window(served, concurrency, moeperf_settings.quick)
    describe(perf, served, concurrency)
    tol = served.profile.tolerances
    samples = latency_samples(result.window.outcomes)
    perf.record("tpot_ms", samples["tpot"], unit="ms", better="lower", tolerance=tol.latency)
    perf.record("itl_mean_ms", result.window.metrics.itl_ms.mean, unit="ms", better="lower", tolerance=tol.latency)
    perf.record("ttft_ms", samples["ttft"], unit="ms", better="lower", tolerance=tol.ttft)
    if result.engine_tpot_ms is not None:
        perf.record("engine_tpot_ms", result.engine_tpot_ms, unit="ms", better="lower", tolerance=tol.latency)
    perf.record(
        "output_throughput", result.window.metrics.output_throughput, unit="tok/s", better="higher",
        tolerance=tol.throughput,
    )  # fmt: skip
    check_failures(result.window.metrics)
    if served.profile.speculative is None:
        assert result.acceptance is None, f"{served.base_url} reports spec-decode drafts without a speculative config"
        return
    stats = result.acceptance
    assert stats is not None, f"{served.profile.name}: no spec-decode drafts were counted over the window"
    record_acceptance(perf, stats, tol)
    for pos, rate in enumerate(stats.per_position):
        perf.record(f"acceptance_rate_pos{pos}", rate, unit="ratio", better="higher", tolerance=tol.acceptance)
    floor = served.profile.thresholds.min_acceptance_length
    if floor is not None:
        assert stats.mean_acceptance_length >= floor, (
            f"{served.profile.name} at concurrency {concurrency}: mean acceptance length "
            f"{stats.mean_acceptance_length:.2f} < required {floor:.2f} (rate {stats.acceptance_rate:.1%})"
        )


def paired_speedups(reference: Served, candidate: Served, concurrency: int, quick: bool) -> list[float]:
    """Per-round speedups from windows that alternate reference and candidate on the same prompts, so both see
    the same machine state (a shared CI box drifts more between minutes than between neighbouring seconds)."""
    wl = WORKLOADS[candidate.profile.device]
    rounds = 2 if quick else 4
    per_round = max(2 * concurrency, wl.requests // rounds)
    ratios = []
    for r in range(rounds):
        requests = candidate.prompt_set(PROMPTS, per_round, wl.output_len, seed=100 + r)
        ref = reference.measure(requests, ClosedLoop(concurrency))
        cand = candidate.measure(requests, ClosedLoop(concurrency))
        check_failures(ref.window.metrics)
        check_failures(cand.window.metrics)
        ratios.append(speedup(*(tpot_ms(w) for w in (ref, cand))))
    return ratios


@pytest.mark.parametrize(("served", "concurrency"), SPECULATIVE_PLAN, indirect=["served"])
def test_speedup(
    served: Served, concurrency: int, perf: PerfRecorder, serve: ServerPool, moeperf_settings: Settings
) -> None:
    """Speedup = reference TPOT / candidate TPOT, same workload and concurrency, per round of alternating windows
    (the engine's TPOT, see :func:`tpot_ms`); the median round is judged and must reach ``min_speedup``."""
    reference_name = served.profile.reference
    assert reference_name is not None, f"profile {served.profile.name} names no reference profile"
    ratios = paired_speedups(serve(reference_name), served, concurrency, moeperf_settings.quick)
    describe(perf, served, concurrency)
    perf.context(reference=reference_name)
    perf.record("speedup", ratios, unit="x", better="higher", tolerance=served.profile.tolerances.speedup)
    floor = served.profile.thresholds.min_speedup
    middle = percentile(ratios, 50.0)
    if floor is not None:
        assert middle >= floor, (
            f"{served.profile.name} at concurrency {concurrency} does not pay for itself: median speedup "
            f"{middle:.2f}x over {len(ratios)} rounds (each: {', '.join(f'{x:.2f}' for x in ratios)}) "
            f"< required {floor:.2f}x against {reference_name}"
        )
