"""Speculative decoding: does a draft pay for itself? Acceptance and TPOT speedup per candidate and concurrency.

Every profile (the no-speculation reference and each draft candidate) decodes the same bundled prompt set with
natural repetition (``ignore_eos``, fixed output length) at each concurrency. A candidate's acceptance comes from
vLLM's spec-decode counters over exactly its measured window; its speedup is the reference's median TPOT over
its own, same model, build and workload. Thresholds (minimum acceptance length and speedup) live in the
candidate's profile; the comparison table of candidates is in the reports.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.serving.fixtures import ServerPool
from pytest_moeperf.serving.loadgen import ClosedLoop
from pytest_moeperf.serving.metrics import latency_samples, percentile
from pytest_moeperf.serving.recording import PerfRecorder, check_failures, record_acceptance
from pytest_moeperf.serving.served import Served, SpecWindow
from pytest_moeperf.serving.specdecode import speedup
from pytest_moeperf.settings import Settings

pytestmark = pytest.mark.specdecode

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


Windows = dict[tuple[str, int], SpecWindow]


def decode_window(served: Served, concurrency: int, cache: Windows, quick: bool) -> SpecWindow:
    """The profile's window at this concurrency, measured once per session, shared by the tests that need it."""
    key = (served.profile.name, concurrency)
    if key not in cache:
        wl = WORKLOADS[served.profile.device]
        count = max(8, wl.requests // 2) if quick else wl.requests
        requests = served.prompt_set(PROMPTS, count + wl.warmup, wl.output_len, seed=0)
        cache[key] = served.measure(requests[wl.warmup :], ClosedLoop(concurrency), warmup=requests[: wl.warmup])
    return cache[key]


def median_tpot_ms(window: SpecWindow) -> float:
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
    spec_windows: Windows,
    moeperf_settings: Settings,
) -> None:
    """TPOT, ITL, TTFT and output throughput of the profile; acceptance figures when it speculates."""
    result = decode_window(served, concurrency, spec_windows, moeperf_settings.quick)
    describe(perf, served, concurrency)
    tol = served.profile.tolerances
    samples = latency_samples(result.window.outcomes)
    perf.record("tpot_ms", samples["tpot"], unit="ms", better="lower", tolerance=tol.latency)
    perf.record("itl_mean_ms", result.window.metrics.itl_ms.mean, unit="ms", better="lower", tolerance=tol.latency)
    perf.record("ttft_ms", samples["ttft"], unit="ms", better="lower", tolerance=tol.latency)
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


@pytest.mark.parametrize(("served", "concurrency"), SPECULATIVE_PLAN, indirect=["served"])
def test_speedup(
    served: Served,
    concurrency: int,
    perf: PerfRecorder,
    serve: ServerPool,
    spec_windows: Windows,
    moeperf_settings: Settings,
) -> None:
    """Speedup = reference median TPOT / candidate median TPOT, on the same workload and concurrency."""
    reference_name = served.profile.reference
    assert reference_name is not None, f"profile {served.profile.name} names no reference profile"
    reference = serve(reference_name)
    cand = decode_window(served, concurrency, spec_windows, moeperf_settings.quick)
    ref = decode_window(reference, concurrency, spec_windows, moeperf_settings.quick)
    check_failures(cand.window.metrics)
    check_failures(ref.window.metrics)
    ratio = speedup(median_tpot_ms(ref), median_tpot_ms(cand))
    describe(perf, served, concurrency)
    perf.context(reference=reference_name)
    perf.record("speedup", ratio, unit="x", better="higher", tolerance=served.profile.tolerances.latency)
    floor = served.profile.thresholds.min_speedup
    if floor is not None:
        assert ratio >= floor, (
            f"{served.profile.name} at concurrency {concurrency} does not pay for itself: TPOT "
            f"{median_tpot_ms(cand):.2f} ms vs {median_tpot_ms(ref):.2f} ms without speculation, "
            f"speedup {ratio:.2f}x < required {floor:.2f}x"
        )
