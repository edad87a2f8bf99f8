"""End-to-end serving: `vllm bench serve` metrics of each profile, judged against baselines.

The profiles are data (``--moeperf-profiles``, default ``suites/serving/profiles``; or the servers attached with
``--moeperf-server-url``): ``pytest_generate_tests`` below runs every no-speculation profile (every attached
server) through the plan of its device. Random-token prompts of fixed input length with ``ignore_eos``; a
concurrency sweep in closed loop (on a GPU, outputs spread evenly over +-25 % from 2 clients on, so that the clients
fall out of step: `Workload.output_spread`), an open-loop request rate (Poisson and bursty gamma arrivals), and the
chat endpoint (bundled prompts, each opened with a distinct tag so that the prefix cache serves none). Every
window is scored on its plateau (its first and last C completions, the ramp and the drain, set aside and counted)
and records TTFT, TPOT, E2EL (ms, lower is better: medians, and means beside the server's), ITL's mean, their p90
(and p99 from `Workload.p99_from` clients on) with order-statistic bounds, the server's own means over the same
plateau (``engine_*_mean_ms``) and the client/server ratios, request/output/total-token throughput and goodput
(higher is better), and fails on any failed request (a short answer is one). Before each window an unmeasured pass
of the same shape warms the server; a window whose first and last quarter of blocks differ (drift) says so. Each
window's plateau is sized to bound the percentiles it gates (p90: 29 requests, p99: 299) and, on the GPU, to hold
the drift check's 10 blocks of C requests (`Workload.drift_blocks`); `planned_windows` lists them for the time
model (`pytest_moeperf.serving.load.timing`). Each launched profile's time to healthy is recorded
(``startup_s``). A window on a launched server is one observation of its start (``--moeperf-starts``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.serving.analysis.metrics import Slo
from pytest_moeperf.serving.analysis.tails import window_count
from pytest_moeperf.serving.lifecycle.served import Served
from pytest_moeperf.serving.load.loadgen import ClosedLoop, Endpoint, LoadShape, OpenLoop
from pytest_moeperf.serving.load.prompts import spread_outputs
from pytest_moeperf.serving.load.timing import Planned
from pytest_moeperf.serving.load.warm import warm_count
from pytest_moeperf.serving.models.profiles import ServeProfile
from pytest_moeperf.serving.plugin import profile_params, profiles_for
from pytest_moeperf.serving.recording import PerfRecorder, record_startup, record_window, sized_workload
from pytest_moeperf.settings import Settings

# A metric's threshold is the profile's minimum effect or the between-run noise its baseline learned from
# independent rounds (on 2 shared CPU cores client TTFT is bimodal between rounds: 21 ms or 230 ms), whichever is
# larger; per-request spread within one window is not run-to-run noise and sets no threshold once 3 runs are stored.
pytestmark = pytest.mark.serving

PROMPTS = Path(__file__).parents[1] / "specdecode" / "prompts" / "repetitive.json"
CHAT_CONCURRENCY = 2  # the chat window's clients (a captured CUDA-graph size of the GPU profiles)
CHAT_PROMPT_TOKENS = 320  # bound: the longest bundled prompt has 251 characters (>= 1 per token), a tag, the template


@dataclass(frozen=True)
class Workload:
    requests: int  # a window's plateau, at least (the profile's ``requests`` overrides it), before sizing
    input_len: int
    output_len: int  # >= 128 on the GPU: a request's TPOT averages that many steps
    warmup: int  # the warm pass's floor (`warm.warm_count`)
    slo: Slo
    concurrencies: tuple[int, ...]
    rates: tuple[tuple[float, float], ...]  # (requests/s, burstiness)
    p99_from: int  # closed loops from this concurrency on also gate p99 (299 requests, seconds there); p90 everywhere
    output_spread: float = 0.0  # closed loops of 2+ clients: outputs over output_len x [1 -+ spread] (`spread_outputs`)
    drift_blocks: int = 0  # the plateau holds at least this many blocks of C requests (the drift check needs 10)
    open_edge: int = 1  # an open loop's requests in flight, expected: set aside at each end of its window

    def edge(self, shape: LoadShape) -> int:
        """Requests set aside at each end of a window of ``shape`` (its plateau's edge)."""
        return shape.concurrency if isinstance(shape, ClosedLoop) else self.open_edge

    def spread(self, shape: LoadShape, endpoint: Endpoint) -> float:
        """The output spread of a window: clients in step (a closed loop of 2+, random prompts) need one."""
        closed = isinstance(shape, ClosedLoop) and shape.concurrency > 1 and endpoint is Endpoint.COMPLETIONS
        return self.output_spread if closed else 0.0

    def tails(self, shape: LoadShape) -> tuple[float, ...]:
        return (90.0, 99.0) if isinstance(shape, ClosedLoop) and shape.concurrency >= self.p99_from else (90.0,)


# Per device: the CPU numbers keep CI within minutes (plateaus of 29 requests: p90 bounded; the drift check runs
# where they hold 10 blocks); the GPU ones are the investigation's decode-heavy chat, sized to the time model (one
# start of every TP=1 profile measured 324 s on 1x H200: suites/serving/README.md, "Time"): 128 output tokens,
# plateaus of 29 requests or 10 blocks of C (c=16: 160; c=64: 640, which also bounds p99), an open loop at 8
# requests/s (~4 in flight).
WORKLOADS = {
    "cpu": Workload(29, 128, 64, 2, Slo(ttft_ms=1000, tpot_ms=50), (1, 4), ((8.0, 1.0), (8.0, 0.5)), 1 << 30,
                    open_edge=4),
    "cuda": Workload(29, 1024, 128, 2, Slo(ttft_ms=2000, tpot_ms=50), (1, 16, 64), ((8.0, 1.0),), 64, 0.25,
                     drift_blocks=10, open_edge=4),
}


def window_size(profile: ServeProfile, shape: LoadShape, window_requests: int | None = None, quick: bool = False
                ) -> tuple[int, tuple[float, ...]]:
    """Requests in the window and the percentiles it gates: its plateau is ``--moeperf-window-requests``, else the
    profile's (or the workload's) count, raised to what the percentiles and the drift blocks need, and its edges
    are added (`tails.window_count`); ``--moeperf-quick`` halves the plateau and does not raise it."""
    wl = WORKLOADS[profile.device]
    tails = wl.tails(shape)
    requested = window_requests or profile.requests or wl.requests
    count = window_count(requested, tails, quick, edge=wl.edge(shape), blocks=wl.drift_blocks)
    return count, tails


def shapes(profile: ServeProfile) -> list[tuple[str, LoadShape, Endpoint]]:
    """The windows of a profile: (test, load shape, endpoint), in the order the tests run them."""
    wl = WORKLOADS[profile.device]
    return [*((f"test_closed_loop[c{c}]", ClosedLoop(c), Endpoint.COMPLETIONS) for c in wl.concurrencies),
            *((f"test_open_loop[{OpenLoop(r, b).label}]", OpenLoop(r, b), Endpoint.COMPLETIONS) for r, b in wl.rates),
            ("test_chat_closed_loop", ClosedLoop(2), Endpoint.CHAT)]


def planned_windows(profile: ServeProfile, window_requests: int | None = None, quick: bool = False) -> list[Planned]:
    """Every window this suite runs on ``profile`` in one start, as the time model reads them."""
    wl = WORKLOADS[profile.device]
    planned = []
    for test, shape, _ in shapes(profile):
        count, _ = window_size(profile, shape, window_requests, quick)
        planned.append(Planned(test, shape, count, warm_count(shape, count, wl.warmup), wl.output_len, profile.method))
    return planned


def measured(config: pytest.Config) -> list[ServeProfile]:
    """No-speculation profiles (their speculating siblings are the spec-decode suite's), and attached servers."""
    return [p for p in profiles_for(config).values() if not p.speculates or p.attached_url is not None]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    def lengths(p: ServeProfile) -> tuple[int, int]:  # the longest request (an output spread's top)
        wl = WORKLOADS[p.device]
        return wl.input_len, math.ceil(wl.output_len * (1.0 + wl.output_spread))

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
    began = time.monotonic()
    wl = WORKLOADS[served.profile.device]
    count, tails = window_size(served.profile, shape, settings.window_requests, settings.quick)
    warm = warm_count(shape, count, wl.warmup)
    seed = served.fresh_seed()
    spread = wl.spread(shape, endpoint)
    if endpoint is Endpoint.CHAT:  # distinct: a cycled prompt would be answered from the prefix cache
        requests = served.prompt_set(PROMPTS, count + warm, wl.output_len, seed=seed, distinct=True)
        workload = f"{PROMPTS.name}, distinct, {wl.output_len} out"
    else:  # prompts no earlier window sent: the prefix cache would shorten their prefills
        requests = served.random_requests(count + warm, wl.input_len, wl.output_len, seed=seed)
        outputs = f"outputs x[{1 - spread:g}, {1 + spread:g}] evenly" if spread else "outputs fixed"
        workload = f"random {wl.input_len} in / {wl.output_len} out, {outputs}"
    window = spread_outputs(requests[warm:], spread, seed=seed)
    result = served.measure(window, shape, warm=spread_outputs(requests[:warm], spread, seed=seed), slo=wl.slo,
                            endpoint=endpoint)
    perf.context(
        profile=served.profile.name,
        model=served.profile.model,
        tp=served.profile.tp,
        load=shape.label,
        endpoint=result.window.endpoint.value,  # what the window really called
        input_len=wl.input_len if endpoint is Endpoint.COMPLETIONS else None,
        output_len=wl.output_len,
        requests=count,
        # part of the metrics' identity: a baseline of another workload (or scored on the whole window) is not compared
        workload=sized_workload(f"{workload}; plateau", settings.window_requests),
        server_pids=",".join(map(str, served.server_pids)) or None,
        # what a window and a start cost: the plan of starts x windows reads them (`judging.levels`)
        window_s=round(time.monotonic() - began, 1),
        start_s=None if served.startup_s is None else round(served.startup_s, 1),
    )
    perf.context(**served.start_settings())  # async scheduling, graph sizes, CPU placement: the start's settings
    # the engine's TPOT tells a window whose answers arrived in bursts from a fast one: seen in a clean-clone CI
    # run, chat closed loop on 2 cores, client TTFT 31 -> 401 ms = E2EL with TPOT 0.013 ms, every answer in >= 3
    # chunks (a role chunk, the text, the finish), so the chunk count alone did not see it; the engine's TTFT tells
    # a window whose first tokens reached the client late, however the rest streamed
    record_window(perf, result, served.profile.tolerances, tails=tails)


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
    measure_and_record(served, perf, ClosedLoop(CHAT_CONCURRENCY), moeperf_settings, Endpoint.CHAT)
