"""End-to-end serving: `vllm bench serve` metrics of each no-speculation profile, judged against baselines.

Random-token prompts of fixed lengths with ``ignore_eos``; a concurrency sweep in closed loop, an open-loop
request rate (Poisson and bursty gamma arrivals), and the chat endpoint. Every window records TTFT, TPOT,
ITL, E2EL (ms, lower is better), request/output/total-token throughput and goodput (higher is better), and
fails on any failed request.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.serving.loadgen import ClosedLoop, Endpoint, LoadShape, OpenLoop
from pytest_moeperf.serving.metrics import Slo
from pytest_moeperf.serving.recording import PerfRecorder, record_serving
from pytest_moeperf.serving.served import Served
from pytest_moeperf.settings import Settings

# Per-request latencies spread with the workload (queueing, prompt mix), not with run-to-run noise: judge them
# against the profile's tolerance (chosen from an A/A rerun on that box), not against a multiple of their IQR.
pytestmark = [pytest.mark.serving, pytest.mark.moeperf_threshold(noise_k=0.0)]

PROMPTS = Path(__file__).parents[1] / "specdecode" / "prompts" / "repetitive.json"


@dataclass(frozen=True)
class Workload:
    requests: int
    input_len: int
    output_len: int
    warmup: int
    slo: Slo


# Per device: the CPU numbers keep CI within minutes; the GPU ones are the investigation's decode-heavy chat.
WORKLOADS = {
    "cpu": Workload(requests=24, input_len=128, output_len=64, warmup=2, slo=Slo(ttft_ms=1000, tpot_ms=50)),
    "cuda": Workload(requests=200, input_len=1024, output_len=256, warmup=8, slo=Slo(ttft_ms=2000, tpot_ms=50)),
}

CLOSED_LOOP = [
    pytest.param("cpu-tiny-nospec", 1, id="cpu-tiny-c1"),
    pytest.param("cpu-tiny-nospec", 4, id="cpu-tiny-c4"),
    pytest.param("kimi-k25-tp8-nospec", 1, id="kimi-tp8-c1"),
    pytest.param("kimi-k25-tp8-nospec", 16, id="kimi-tp8-c16"),
    pytest.param("kimi-k25-tp8-nospec", 64, id="kimi-tp8-c64"),
]

OPEN_LOOP = [
    pytest.param("cpu-tiny-nospec", 8.0, 1.0, id="cpu-tiny-r8-poisson"),
    pytest.param("cpu-tiny-nospec", 8.0, 0.5, id="cpu-tiny-r8-gamma0.5"),
    pytest.param("kimi-k25-tp8-nospec", 4.0, 1.0, id="kimi-tp8-r4-poisson"),
]


def measure_and_record(
    served: Served, perf: PerfRecorder, shape: LoadShape, settings: Settings, endpoint: Endpoint
) -> None:
    wl = WORKLOADS[served.profile.device]
    count = max(8, wl.requests // 2) if settings.quick else wl.requests
    if endpoint is Endpoint.CHAT:
        requests = served.prompt_set(PROMPTS, count + wl.warmup, wl.output_len, seed=1)
    else:
        requests = served.random_requests(count + wl.warmup, wl.input_len, wl.output_len, seed=0)
    perf.context(
        profile=served.profile.name,
        model=served.profile.model,
        tp=served.profile.tp,
        load=shape.label,
        endpoint=endpoint.value,
        input_len=wl.input_len if endpoint is Endpoint.COMPLETIONS else None,
        output_len=wl.output_len,
        requests=count,
    )
    result = served.measure(requests[wl.warmup :], shape, warmup=requests[: wl.warmup], slo=wl.slo)
    record_serving(perf, result.window, served.profile.tolerances)


@pytest.mark.parametrize(("served", "concurrency"), CLOSED_LOOP, indirect=["served"])
def test_closed_loop(served: Served, concurrency: int, perf: PerfRecorder, moeperf_settings: Settings) -> None:
    measure_and_record(served, perf, ClosedLoop(concurrency), moeperf_settings, Endpoint.COMPLETIONS)


@pytest.mark.parametrize(("served", "rate", "burstiness"), OPEN_LOOP, indirect=["served"])
def test_open_loop(
    served: Served, rate: float, burstiness: float, perf: PerfRecorder, moeperf_settings: Settings
) -> None:
    shape = OpenLoop(rate=rate, burstiness=burstiness, seed=0)
    measure_and_record(served, perf, shape, moeperf_settings, Endpoint.COMPLETIONS)


@pytest.mark.parametrize(
    "served",
    [pytest.param("cpu-tiny-nospec", id="cpu-tiny"), pytest.param("kimi-k25-tp8-nospec", id="kimi-tp8")],
    indirect=True,
)
def test_chat_closed_loop(served: Served, perf: PerfRecorder, moeperf_settings: Settings) -> None:
    measure_and_record(served, perf, ClosedLoop(2), moeperf_settings, Endpoint.CHAT)
