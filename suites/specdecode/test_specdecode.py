"""Speculative decoding: does a draft pay for itself? Acceptance and TPOT speedup per candidate and concurrency.

The profiles are data (``--moeperf-profiles``; or attached servers): ``pytest_generate_tests`` below runs every
speculating profile and the references they name (every attached server, in attach mode) through the plan of its
device. Every profile decodes the same bundled prompt set with natural repetition (``ignore_eos``, fixed output
length) at each concurrency, scored on the window's plateau. A candidate's acceptance comes from vLLM's
spec-decode counters over exactly its measured window. Its speedup is the reference's TPOT over its own (the engine's
mean TPOT over the plateau, ``vllm:request_time_per_output_token_seconds``, engine-core timestamps: the client's TPOT
collapses when a lagging API server sends a whole answer in one SSE chunk, which a busy CPU box does), from the two
servers' decode windows of the same start, same prompts and concurrency: the speed-up reuses the reference's start
and its window instead of starting it again (``speedup_method``: "decode windows of one start"; a start is one
observation, ``--moeperf-starts``). Thresholds (minimum acceptance length and speedup) live in the candidate's
profile; the comparison table of candidates is in the reports.

A profile that pins its acceptance (``rejection_sample_method: synthetic``, `serving.models.acceptance`) measures the
real step costs at that acceptance: each window checks from ``/metrics`` that it measured the pinned length (+-2 %;
INCONCLUSIVE, with a warning line, where the knob did not take), and every window records the time of a sequence's
decode step and the tokens a step emits (`serving.speculation`). ``--moeperf-acceptance-lengths`` runs each pinned
profile at other lengths too (variants ``<profile>+al<L>``); with 3 or more lengths of a profile and its reference in
one start, ``test_break_even`` fits the acceptance length at which its TPOT equals the reference's
(``break_even_acceptance_length``, lower is better; `serving.analysis.breakeven`) and the reports tabulate it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest

from pytest_moeperf.serving.analysis.breakeven import AT, MIN_POINTS, NEVER, Point, break_even, fit_tpot
from pytest_moeperf.serving.analysis.metrics import coalesced, latency_samples, percentile
from pytest_moeperf.serving.analysis.specdecode import pinned_miss
from pytest_moeperf.serving.analysis.tails import window_count
from pytest_moeperf.serving.lifecycle.served import Served, SpecWindow
from pytest_moeperf.serving.load.loadgen import ClosedLoop
from pytest_moeperf.serving.load.timing import Planned
from pytest_moeperf.serving.load.warm import warm_count
from pytest_moeperf.serving.models.acceptance import cpu_pinning_blocker
from pytest_moeperf.serving.models.profiles import ServeProfile
from pytest_moeperf.serving.models.variants import OPTION
from pytest_moeperf.serving.plugin import Pool, profile_params, profiles_for
from pytest_moeperf.serving.recording import (
    PerfRecorder,
    check_failures,
    record_acceptance,
    record_engine,
    record_latencies,
    record_startup,
    record_window_facts,
    sized_workload,
)
from pytest_moeperf.serving.speculation import record_break_even, record_pinned, record_steps
from pytest_moeperf.settings import Settings

# A metric's threshold is the profile's minimum effect or the between-run noise its baseline learned from
# independent rounds (on 2 shared CPU cores client TTFT is bimodal between rounds: 21 ms or 230 ms), whichever is
# larger; per-request spread within one window is not run-to-run noise and sets no threshold once 3 runs are stored.
pytestmark = pytest.mark.specdecode

PROMPTS = Path(__file__).parent / "prompts" / "repetitive.json"


PROMPT_TOKENS = 320  # bound: the longest bundled prompt has 251 characters (>= 1 per token), rounded up


@dataclass(frozen=True)
class Workload:
    requests: int  # a decode window's plateau, at least (the profile's ``requests`` overrides it)
    output_len: int
    warmup: int  # the warm pass's floor (`warm.warm_count`)
    concurrencies: tuple[int, ...]
    tails: tuple[float, ...] = ()  # the percentiles of TTFT and ITL gated (p90: a plateau of 29 bounds it at 95 %)
    drift_blocks: int = 0  # the plateau holds at least this many blocks of C requests (the drift check needs 10)


# CPU: the p90s gated (29 requests); GPU: the acceptance, TPOT and speed-up of every candidate in three starts of a
# 600 s batch: 128 output tokens, plateaus of 10 blocks of C (the drift check), no tails (the serving suite's job),
# at c=1 (where speculation pays most) and c=16 (a batch large enough for its extra work to cost)
WORKLOADS = {"cpu": Workload(29, 96, 2, (1, 4), tails=(90.0,)),
             "cuda": Workload(10, 128, 2, (1, 16), drift_blocks=10)}


def decoded(config: pytest.Config) -> list[ServeProfile]:
    """Speculating profiles and the references they name (in attach mode: every attached server)."""
    profiles = profiles_for(config)
    refs = {p.reference for p in profiles.values() if p.speculates and p.reference is not None}
    return [p for p in profiles.values() if p.speculates or p.name in refs or p.attached_url is not None]


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    def lengths(p: ServeProfile) -> tuple[int, int]:
        return PROMPT_TOKENS, WORKLOADS[p.device].output_len

    def per_concurrency(p: ServeProfile) -> list[tuple[str, tuple[int]]]:
        return [(f"c{c}", (c,)) for c in WORKLOADS[p.device].concurrencies]

    profiles = decoded(metafunc.config)
    name = metafunc.function.__name__
    if name == "test_startup":
        profile_params(metafunc, [p for p in profiles if p.speculates and p.attached_url is None])
    elif name == "test_decode":
        profile_params(metafunc, profiles, ["concurrency"], per_concurrency, lengths=lengths)
    elif name == "test_speedup":
        # a speculating profile that names its reference, or an attached candidate=URL (whatever it runs)
        candidates = [p for p in profiles if p.reference is not None and (p.speculates or p.attached_url is not None)]
        # by name: the pair's measurement starts the servers it needs, in the order it needs them
        profile_params(
            metafunc, candidates, ["concurrency"], per_concurrency, lengths=lengths, argname="candidate_name"
        )
    elif name == "test_break_even":  # a pinned profile (not a variant of one) that names its reference
        pinned = [p for p in profiles if p.pinned_acceptance is not None and p.variant_of is None
                  and p.reference is not None]
        profile_params(metafunc, pinned, ["concurrency"], per_concurrency, lengths=lengths, argname="candidate_name")


def window_size(profile: ServeProfile, concurrency: int, window_requests: int | None = None, quick: bool = False
                ) -> int:
    """A decode window's requests: a plateau sized to bound its p90s and hold its drift blocks, and C requests set
    aside at each end (``--moeperf-quick``: half the plateau, nothing raised)."""
    wl = WORKLOADS[profile.device]
    return window_count(window_requests or profile.requests or wl.requests, wl.tails, quick, edge=concurrency,
                        blocks=wl.drift_blocks)


def planned_windows(profile: ServeProfile, window_requests: int | None = None, quick: bool = False) -> list[Planned]:
    """Every window this suite runs on ``profile`` in one start (the speed-up adds none), for the time model."""
    wl = WORKLOADS[profile.device]
    planned = []
    for c in wl.concurrencies:
        count = window_size(profile, c, window_requests, quick)
        planned.append(Planned(f"test_decode[c{c}]", ClosedLoop(c), count, warm_count(ClosedLoop(c), count,
                                                                                      wl.warmup),
                               wl.output_len, profile.method))
    return planned


def decode_window(served: Served, concurrency: int, settings: Settings) -> SpecWindow:
    """A window of the suite's prompts (the same for every profile: a speed-up compares two servers on them), after
    a warm pass of its shape (`warm.warm_count`)."""
    wl = WORKLOADS[served.profile.device]
    count = window_size(served.profile, concurrency, settings.window_requests, settings.quick)
    shape = ClosedLoop(concurrency)
    warm = warm_count(shape, count, wl.warmup)
    requests = served.prompt_set(PROMPTS, count + warm, wl.output_len, seed=0)
    return served.measure(requests[warm:], shape, warm=requests[:warm])


def tpot_ms(window: SpecWindow) -> float:
    """The engine's mean TPOT over the window when the server exports it, else the client's median TPOT (unless
    the stream coalesced: then there is no TPOT to compare, and the test fails saying so)."""
    if window.engine_tpot_ms is not None:
        return window.engine_tpot_ms
    lumped = coalesced(window.window.outcomes)
    if lumped is not None:
        pytest.fail(f"no TPOT for the speedup: the server exports no engine TPOT and {lumped}", pytrace=False)
    return percentile(latency_samples(window.window.outcomes)["tpot"], 50.0)


def describe(perf: PerfRecorder, profile: ServeProfile, concurrency: int, window_requests: int | None = None) -> None:
    spec = profile.speculative or {}
    output_len = WORKLOADS[profile.device].output_len
    perf.context(
        profile=profile.name,
        model=profile.model,
        spec_method=profile.method,
        draft=str(spec.get("model", "")) or None,
        num_speculative_tokens=int(spec["num_speculative_tokens"]) if "num_speculative_tokens" in spec else None,
        concurrency=concurrency,
        workload=sized_workload(f"{PROMPTS.name}, {output_len} out; plateau", window_requests),
    )


def test_startup(served: Served, perf: PerfRecorder) -> None:
    """Time from launching the profile's server to its first healthy ``/health`` (its first start here)."""
    describe(perf, served.profile, 0)
    record_startup(perf, served)


@pytest.fixture(scope="session")
def decode_windows() -> dict[tuple[str, int], SpecWindow]:
    """The decode windows of this session (one start), by profile and concurrency: the speed-ups read them."""
    return {}


def test_decode(
    served: Served,
    concurrency: int,
    perf: PerfRecorder,
    moeperf_settings: Settings,
    decode_windows: dict[tuple[str, int], SpecWindow],
) -> None:
    """TPOT, ITL, TTFT and output throughput of the profile; acceptance figures when it speculates."""
    result = decode_window(served, concurrency, moeperf_settings)
    decode_windows[(served.profile.name, concurrency)] = result
    describe(perf, served.profile, concurrency, moeperf_settings.window_requests)
    perf.context(**served.start_settings())  # async scheduling, graph sizes, CPU placement: the start's settings
    tol = served.profile.tolerances
    check_failures(result.all_requests.metrics)
    record_window_facts(perf, result, tol)  # the warm pass's cost and the drift check, before anything is recorded
    # seen in a clean-clone CI run: client TTFT 51 -> 439 ms while client TPOT 4.5 ms ~ the engine's 4.9 ms; the
    # engine's TTFT tells such a window (first tokens late on their way to the client) and guards TTFT in it
    record_latencies(perf, result.window, tol, e2el=False, engine_tpot_ms=result.engine_tpot_ms,
                     engine_ttft_ms=result.engine_ttft_ms, tails=WORKLOADS[served.profile.device].tails)  # fmt: skip
    record_engine(perf, result.engine, tol)
    perf.record(
        "output_throughput", result.window.metrics.output_throughput, unit="tok/s", better="higher",
        tolerance=tol.throughput,
    )  # fmt: skip
    record_steps(perf, result, tol)  # a sequence's decode step (engine TPOT x tokens a step emits), tokens per step
    if served.profile.speculative is None:
        assert result.acceptance is None, f"{served.base_url} reports spec-decode drafts without a speculative config"
        return
    stats = result.acceptance
    assert stats is not None, f"{served.profile.name}: no spec-decode drafts were counted over the window"
    record_acceptance(perf, stats, tol)
    record_pinned(perf, served.profile, stats)  # a pinned profile: the window measured the pinned length, or says not
    for pos, rate in enumerate(stats.per_position):
        perf.record(f"acceptance_rate_pos{pos}", rate, unit="ratio", better="higher", tolerance=tol.acceptance)
    floor = served.profile.thresholds.min_acceptance_length
    if floor is not None:
        assert stats.mean_acceptance_length >= floor, (
            f"{served.profile.name} at concurrency {concurrency}: mean acceptance length "
            f"{stats.mean_acceptance_length:.2f} < required {floor:.2f} (rate {stats.acceptance_rate:.1%})"
        )


def test_speedup(
    candidate_name: str,
    concurrency: int,
    perf: PerfRecorder,
    serve: Pool,
    serve_profiles: dict[str, ServeProfile],
    decode_windows: dict[tuple[str, int], SpecWindow],
    moeperf_settings: Settings,
) -> None:
    """Speedup = reference TPOT / candidate TPOT (the engine's, see :func:`tpot_ms`), from both servers' decode
    windows of this start at this concurrency (measured here only when no decode test ran them); it must reach
    ``min_speedup``. One value a start: its rounds are the starts."""
    candidate = serve_profiles[candidate_name]
    reference = candidate.reference
    assert reference is not None, f"profile {candidate.name} names no reference profile"
    windows = {}
    for name in (reference, candidate.name):
        if (name, concurrency) not in decode_windows:  # its decode test was not selected, or skipped
            decode_windows[(name, concurrency)] = decode_window(serve(name), concurrency, moeperf_settings)
        windows[name] = decode_windows[(name, concurrency)]
        check_failures(windows[name].all_requests.metrics)
    ratio = tpot_ms(windows[reference]) / tpot_ms(windows[candidate.name])
    describe(perf, candidate, concurrency, moeperf_settings.window_requests)
    perf.context(reference=reference, speedup_method="decode windows of one start",
                 reference_tpot_ms=round(tpot_ms(windows[reference]), 4),
                 candidate_tpot_ms=round(tpot_ms(windows[candidate.name]), 4))
    compiled = [n for n, w in windows.items() if w.compiles.count]
    if compiled:
        perf.inconclusive(f"the server logged kernel compiles during the decode window of {', '.join(compiled)}")
    perf.record("speedup", ratio, unit="x", better="higher", tolerance=candidate.tolerances.speedup)
    floor = candidate.thresholds.min_speedup
    if floor is not None:
        assert ratio >= floor, (
            f"{candidate.name} at concurrency {concurrency} does not pay for itself: speedup {ratio:.2f}x "
            f"(TPOT {tpot_ms(windows[reference]):.3g} ms without, {tpot_ms(windows[candidate.name]):.3g} ms with) "
            f"< required {floor:.2f}x against {reference}"
        )


def test_break_even(
    candidate_name: str,
    concurrency: int,
    perf: PerfRecorder,
    serve_profiles: dict[str, ServeProfile],
    decode_windows: dict[tuple[str, int], SpecWindow],
    moeperf_settings: Settings,
) -> None:
    """The acceptance length at which the pinned profile's TPOT equals its reference's at this concurrency, fitted
    (TPOT(L) = a / L + b) on its decode windows of this start at 3 or more pinned lengths (the profile and its
    ``--moeperf-acceptance-lengths`` variants) against the reference's window of the same start. It measures nothing
    itself: without those windows it skips, naming what is missing. A window whose pinned acceptance did not take, or
    whose server compiled kernels during it, is no point."""
    profile = serve_profiles[candidate_name]
    reference = str(profile.reference)
    blocker = cpu_pinning_blocker(profile.name, profile.speculative, profile.device)
    if blocker is not None:
        pytest.skip(f"no break-even: {blocker}")
    points: list[Point] = []
    left_out: list[str] = []
    for member in [profile, *(p for p in serve_profiles.values() if p.variant_of == profile.name)]:
        window = decode_windows.get((member.name, concurrency))
        miss = None if window is None or window.acceptance is None else pinned_miss(
            float(member.pinned_acceptance or 0.0), member.speculative_tokens, window.acceptance)
        if window is None or window.acceptance is None:
            left_out.append(f"{member.name} (no decode window with drafts in this start)")
        elif miss is not None or window.compiles.count:
            left_out.append(f"{member.name} ({'the pinned acceptance did not take' if miss else 'compiled kernels'})")
        else:
            points.append(Point(window.acceptance.mean_acceptance_length, tpot_ms(window)))
    base = decode_windows.get((reference, concurrency))
    if len(points) < MIN_POINTS or base is None:
        k = profile.speculative_tokens
        need = [f"{MIN_POINTS} acceptance points, has {len(points)} (more lengths: {OPTION} k{k}=L,L with L in "
                f"[1, {k + 1}] other than {profile.pinned_acceptance:g})"] if len(points) < MIN_POINTS else []
        need += [f"the reference {reference}'s window at c={concurrency} (select its tests)"] if base is None else []
        pytest.skip(f"break-even of {profile.name} at c={concurrency} needs {' and '.join(need)} in this start"
                    f"{'; left out: ' + ', '.join(left_out) if left_out else ''}")
    found = break_even(fit_tpot(points), tpot_ms(base))
    describe(perf, profile, concurrency, moeperf_settings.window_requests)
    perf.context(reference=reference, left_out="; ".join(left_out) or None)
    if base.compiles.count:
        perf.inconclusive(f"the server logged kernel compiles during the decode window of {reference}")
    if found.status == NEVER:
        pytest.fail(f"{profile.name} at concurrency {concurrency} cannot break even: {found.reason}", pytrace=False)
    if found.status != AT:
        pytest.skip(f"no break-even of {profile.name} at c={concurrency}: {found.reason}")
    record_break_even(perf, profile, found, points)

