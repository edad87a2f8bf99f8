"""End-to-end serving: `vllm bench serve` metrics of each profile, judged against baselines.

The profiles are data (``--moeperf-profiles``, default ``suites/serving/profiles``; or the servers attached with
``--moeperf-server-url``): ``pytest_generate_tests`` below runs every no-speculation profile (every attached
server) through the plan of its device. Random-token prompts of fixed lengths with ``ignore_eos``; a concurrency
sweep in closed loop, an open-loop request rate (Poisson and bursty gamma arrivals), and the chat endpoint. Every
window records TTFT, TPOT, ITL, E2EL (ms, lower is better), request/output/total-token throughput and goodput
(higher is better), and fails on any failed request (a short answer is one). Each launched profile's time to
healthy is recorded once (``startup_s``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.serving.loadgen import ClosedLoop, Endpoint, LoadShape, OpenLoop
from pytest_moeperf.serving.metrics import Slo
from pytest_moeperf.serving.plugin import profile_params, profiles_for
from pytest_moeperf.serving.profiles import ServeProfile
from pytest_moeperf.serving.recording import PerfRecorder, record_serving, record_startup
from pytest_moeperf.serving.served import Served
from pytest_moeperf.settings import Settings

# A metric's threshold is the profile's minimum effect or the between-run noise its baseline learned from
# independent rounds (on 2 shared CPU cores client TTFT is bimodal between rounds: 21 ms or 230 ms), whichever is
# larger; per-request spread within one window is not run-to-run noise and sets no threshold once 3 runs are stored.
pytestmark = pytest.mark.serving

PROMPTS = Path(__file__).parents[1] / "specdecode" / "prompts" / "repetitive.json"
CHAT_PROMPT_TOKENS = 320  # bound: the longest bundled prompt has 251 characters (>= 1 per token) + the chat template


@dataclass(frozen=True)
class Workload:
    requests: int
    input_len: int
    output_len: int
    warmup: int
    slo: Slo
    concurrencies: tuple[int, ...]
    rates: tuple[tuple[float, float], ...]  # (requests/s, burstiness)


# Per device: the CPU numbers keep CI within minutes; the GPU ones are the investigation's decode-heavy chat.
WORKLOADS = {
    "cpu": Workload(24, 128, 64, 2, Slo(ttft_ms=1000, tpot_ms=50), (1, 4), ((8.0, 1.0), (8.0, 0.5))),
    "cuda": Workload(200, 1024, 256, 8, Slo(ttft_ms=2000, tpot_ms=50), (1, 16, 64), ((4.0, 1.0),)),
}


def measured(config: pytest.Config) -> list[ServeProfile]:
    """No-speculation profiles (their speculating siblings are the spec-decode suite's), and attached servers."""
    return [p for p in profiles_for(config).values() if not p.speculates or p.attached_url is not None]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    def lengths(p: ServeProfile) -> tuple[int, int]:
        return WORKLOADS[p.device].input_len, WORKLOADS[p.device].output_len

    profiles = measured(metafunc.config)
    name = metafunc.function.__name__
    if name == "test_startup":
        profile_params(metafunc, [p for p in profiles if p.attached_url is None])
    elif name == "test_closed_loop":
        profile_params(
            metafunc,
            profiles,
            ["concurrency"],
            lambda p: [(f"c{c}", (c,)) for c in WORKLOADS[p.device].concurrencies],
            lengths=lengths,
        )
    elif name == "test_open_loop":
        profile_params(
            metafunc,
            profiles,
            ["rate", "burstiness"],
            lambda p: [(OpenLoop(r, b).label, (r, b)) for r, b in WORKLOADS[p.device].rates],
            lengths=lengths,
        )
    elif name == "test_chat_closed_loop":
        profile_params(metafunc, profiles,
                       lengths=lambda p: (CHAT_PROMPT_TOKENS, WORKLOADS[p.device].output_len))  # fmt: skip


def measure_and_record(
    served: Served, perf: PerfRecorder, shape: LoadShape, settings: Settings, endpoint: Endpoint
) -> None:
    wl = WORKLOADS[served.profile.device]
    full = served.profile.requests or wl.requests
    count = max(8, full // 2) if settings.quick else full
    if endpoint is Endpoint.CHAT:
        requests = served.prompt_set(PROMPTS, count + wl.warmup, wl.output_len, seed=1)
    else:
        requests = served.random_requests(count + wl.warmup, wl.input_len, wl.output_len, seed=0)
    result = served.measure(requests[wl.warmup :], shape, warmup=requests[: wl.warmup], slo=wl.slo, endpoint=endpoint)
    perf.context(
        profile=served.profile.name,
        model=served.profile.model,
        tp=served.profile.tp,
        load=shape.label,
        endpoint=result.window.endpoint.value,  # what the window really called
        input_len=wl.input_len if endpoint is Endpoint.COMPLETIONS else None,
        output_len=wl.output_len,
        requests=count,
    )
    # the engine's TPOT tells a window whose answers arrived in bursts from a fast one: seen in a clean-clone CI
    # run, chat closed loop on 2 cores, client TTFT 31 -> 401 ms = E2EL with TPOT 0.013 ms, every answer in >= 3
    # chunks (a role chunk, the text, the finish), so the chunk count alone did not see it; the engine's TTFT tells
    # a window whose first tokens reached the client late, however the rest streamed
    record_serving(perf, result.window, served.profile.tolerances, engine_tpot_ms=result.engine_tpot_ms,
                   engine_ttft_ms=result.engine_ttft_ms)  # fmt: skip


def test_startup(served: Served, perf: PerfRecorder) -> None:
    """Time from launching the profile's server to its first healthy ``/health`` (its first start here)."""
    perf.context(profile=served.profile.name, model=served.profile.model, tp=served.profile.tp)
    record_startup(perf, served)


def test_closed_loop(served: Served, concurrency: int, perf: PerfRecorder, moeperf_settings: Settings) -> None:
    measure_and_record(served, perf, ClosedLoop(concurrency), moeperf_settings, Endpoint.COMPLETIONS)


def test_open_loop(
    served: Served, rate: float, burstiness: float, perf: PerfRecorder, moeperf_settings: Settings
) -> None:
    shape = OpenLoop(rate=rate, burstiness=burstiness, seed=0)
    measure_and_record(served, perf, shape, moeperf_settings, Endpoint.COMPLETIONS)


def test_chat_closed_loop(served: Served, perf: PerfRecorder, moeperf_settings: Settings) -> None:
    measure_and_record(served, perf, ClosedLoop(2), moeperf_settings, Endpoint.CHAT)
