"""How a measured serving window becomes records on the core ``perf`` fixture, and the failed-request gate.

Latencies are lower-better: TTFT, TPOT and E2EL as per-request samples in ms (their median is judged) and ITL
as vLLM's pooled mean (a single value: the server coalesces tokens into one SSE chunk when its output loop lags,
so the pooled ITL median jumps between microseconds and milliseconds from run to run). A window whose stream
coalesced (most answers in <= 2 chunks, :func:`~pytest_moeperf.serving.analysis.metrics.coalesced`) records neither
client TPOT nor ITL: both collapse towards 0 there and would read as a speed-up. A window whose client TTFT is far
above the engine's own (:func:`~pytest_moeperf.serving.analysis.metrics.delivery_delayed`: the first tokens were held
up on their way to the client) timed the delivery. Either way the context says why (``client_timing``): only the
`CLIENT_TIMED` metrics are INCONCLUSIVE, the engine's own TPOT and TTFT and the acceptance figures still stand.
Throughputs (request, output, total token; goodput) and acceptance figures are higher-better. The failed-request
rate is checked here directly: it must not exceed ``allowed_failed_rate`` (zero unless a test says otherwise), and
the error of every failed request is in the message.

`record_window` records a whole measured window, scored on its plateau (`pytest_moeperf.serving.analysis.plateau`):
the cost of its warm pass, what was set aside at each end, its drift check (a window that drifted makes its
`CLIENT_TIMED` metrics INCONCLUSIVE, `pytest_moeperf.serving.analysis.drift`), the client/server ratios
(`pytest_moeperf.serving.analysis.agreement`), the latencies (medians, and means beside the server's) with the tail
percentiles the window was sized for (`pytest_moeperf.serving.analysis.tails`), and the server's own means as
``engine_*_mean_ms`` metrics (`pytest_moeperf.serving.analysis.arbiter`), which stand whatever the client's clock saw.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from pytest_moeperf.judging import stats
from pytest_moeperf.ledger import STATE, JSONScalar
from pytest_moeperf.serving.analysis import agreement
from pytest_moeperf.serving.analysis.arbiter import ENGINE_METRICS, EngineFigures
from pytest_moeperf.serving.analysis.drift import check_drift
from pytest_moeperf.serving.analysis.metrics import ServingMetrics, coalesced, delivery_delayed, latency_samples
from pytest_moeperf.serving.analysis.specdecode import AcceptanceStats
from pytest_moeperf.serving.analysis.tails import tail_bound, tail_names
from pytest_moeperf.serving.lifecycle.served import Served, SpecWindow
from pytest_moeperf.serving.lifecycle.startlog import STAMPED
from pytest_moeperf.serving.lifecycle.starts import StartInfo
from pytest_moeperf.serving.load.loadgen import ClosedLoop, WindowResult
from pytest_moeperf.serving.models.profiles import Tolerances

__all__ = [
    "CLIENT_TIMED",
    "BATCH_BOUND",
    "FailedRequests",
    "PerfRecorder",
    "batch_shortfall",
    "check_failures",
    "record_acceptance",
    "record_engine",
    "record_latencies",
    "record_serving",
    "record_window",
    "record_window_facts",
    "sized_workload",
    "startup_names",
]


#: what the client's clock measured: a window whose stream coalesced makes these INCONCLUSIVE. The engine's own
#: TPOT and the acceptance counters come from the server's /metrics and still stand (seen: every spec-decode
#: metric of 3 of 4 windows INCONCLUSIVE on a fast CI box, acceptance 5 % mde among them, before the scope)
#: the tail percentiles a window may gate (`pytest_moeperf.serving.analysis.tails`)
TAIL_PCTS = (90.0, 99.0)
CLIENT_TIMED = ("ttft_ms", "tpot_ms", "itl_mean_ms", "e2el_ms", "ttft_mean_ms", "tpot_mean_ms", "e2el_mean_ms",
                "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                *tail_names(TAIL_PCTS))
#: a closed loop of C clients whose engine steps carried fewer than this share of C sequences on average did not load
#: the server as asked (`batch_shortfall`)
BATCH_SHARE = 0.75
#: what the batch a step carries sets: the server's own means and the spec-decode step figures
BATCH_BOUND = (*ENGINE_METRICS, "engine_step_ms", "tokens_per_step")
#: queueing below this many ms is not worth failing for: a window at low load queues for microseconds, whose
#: relative change means nothing
QUEUE_ABS_MS = 1.0


class PerfRecorder(Protocol):
    """The part of the core's ``perf`` fixture used here."""

    def record(
        self,
        name: str,
        samples: float | Sequence[float],
        *,
        unit: str,
        better: str = "lower",
        tolerance: float | None = None,
        abs_tolerance: float | None = None,
        context: dict[str, JSONScalar] | None = None,
    ) -> Any: ...

    def inconclusive(self, reason: str, only: Iterable[str] | None = None) -> None: ...

    def measured_once(self, reason: str) -> None: ...

    def context(self, **kv: Any) -> None: ...


class FailedRequests(AssertionError):
    pass


def sized_workload(workload: str | None, window_requests: int | None) -> str | None:
    """The ``workload`` context of a window sized by ``--moeperf-window-requests``: another size is another
    workload (its ramp and drain weigh otherwise), so baselines of the default size are not compared with it."""
    if not window_requests:
        return workload
    size = f"{window_requests} requests a window"
    return f"{workload}, {size}" if workload else size


#: start-up phases that a warm compile cache shortens: recorded under a name that says the cache's state
#: (``startup_cold_s``, ``startup_compile_warm_s``): a key of a baseline holds one workload, and a cold start is
#: not a slow warm one. On 1x H200 (vLLM 0.26.0, 2026-12-02, 3 cold and 8 warm starts of the tiny profiles, 2 of
#: the Kimi rank) ``model_config`` read 15-30 s cold and 0 s warm (vLLM's model inspection is cached beside the
#: compile cache), ``graphs`` 4-6 s cold and 1 s warm: under one name, a cold start's model_config left a
#: warm-start baseline of 0 s (INCONCLUSIVE "baseline median is 0" on a fresh host)
CACHE_BOUND = ("model_config", "compile", "graphs", "engine_init")
#: the compile-cache states (`startlog.compile_cache`) that name those figures apart. ``partial`` too: on 1x H200
#: (2026-12-03) the Kimi rank's first start after a cold one found part of its graphs compiled; under the plain
#: names, that one start's figures read MISSING in every later session of warm starts
NAMED_STATES = ("cold", "partial", "warm")
#: a phase moving by less than this is not worth failing for (s): two one-second timestamps bound a stamped phase
#: (`startlog.STAMPED`) within 2 s; vLLM's own figures are finer, but a second of a start is noise
PHASE_ABS_S = {True: 2.0, False: 1.0}


def startup_names(compile_cache: str | None) -> tuple[str, Callable[[str], str]]:
    """The name of a start's total and of each of its phases, for a start whose compile cache was
    ``compile_cache`` (`startlog.compile_cache`): each of `NAMED_STATES` names its cache-bound figures apart."""
    state = f"_{compile_cache}" if compile_cache in NAMED_STATES else ""
    return f"startup{state}_s", lambda phase: f"startup_{phase}{state if phase in CACHE_BOUND else ''}_s"


def record_startup(perf: PerfRecorder, served: Served) -> None:
    """The start of ``served``'s server: the time from its launch to its first healthy ``/health`` and each phase
    its log shows (`pytest_moeperf.serving.lifecycle.startlog`), in seconds. The total and the cache-bound phases
    are named by the compile cache's state (`CACHE_BOUND`); the context names the settings the start and its
    windows depend on (compile cache, async scheduling, CUDA-graph sizes, CPU placement) and why a phase is
    missing. Measured once, when the server started: re-running the test would record the same values (no
    confirmation rounds), and the health gate judged that start-up window, not the test's call."""
    assert served.startup_s is not None, f"{served.profile.name}: the server was not started by this session"
    perf.measured_once("the server's start-up is measured once, when it starts")
    start = served.start or StartInfo()
    perf.context(started_together=served.started_together, **start.context())
    for reason in served.startup_health:
        perf.inconclusive(f"start-up window: {reason}")
    total, phase_name = startup_names(start.log.compile_cache)
    # the cache-bound figures name their state: a warm start's session does not miss the cold start's metrics
    state: dict[str, JSONScalar] = ({STATE: f"compile cache {start.log.compile_cache}"}
                                    if start.log.compile_cache in NAMED_STATES else {})
    tol = served.profile.tolerances.latency
    perf.record(total, served.startup_s, unit="s", better="lower", tolerance=tol, context=state)
    for phase, seconds in start.log.seconds.items():
        perf.record(phase_name(phase), seconds, unit="s", better="lower", tolerance=tol,
                    abs_tolerance=PHASE_ABS_S[phase in STAMPED], context=state if phase in CACHE_BOUND else None)


def check_failures(metrics: ServingMetrics, allowed_failed_rate: float = 0.0) -> None:
    """Raise with every distinct error when more requests failed than allowed."""
    if metrics.failed_rate <= allowed_failed_rate:
        return
    distinct: dict[str, int] = {}
    for err in metrics.errors:
        key = err.strip().splitlines()[-1][:300] if err.strip() else "(empty error)"
        distinct[key] = distinct.get(key, 0) + 1
    lines = "\n".join(f"  {n} x {err}" for err, n in sorted(distinct.items(), key=lambda kv: -kv[1]))
    raise FailedRequests(
        f"{metrics.failed} of {metrics.completed + metrics.failed} requests failed "
        f"(rate {metrics.failed_rate:.1%}, allowed {allowed_failed_rate:.1%}):\n{lines}"
    )


def record_serving(
    perf: PerfRecorder,
    window: WindowResult,
    tolerances: Tolerances | None = None,
    *,
    allowed_failed_rate: float = 0.0,
    engine_tpot_ms: float | None = None,
    engine_ttft_ms: float | None = None,
    tails: Sequence[float] = (),
    whole: ServingMetrics | None = None,
) -> None:
    """Record the window's latencies (per-request samples, ms; ``tails``: the percentiles gated with their bounds),
    throughputs and failed rate; then gate failures. ``window`` is what is scored (a plateau); ``whole`` (default:
    ``window``'s) counts the failures, none of which is ever set aside.

    ``engine_tpot_ms`` and ``engine_ttft_ms`` (the server's own TPOT and TTFT over the window, from ``/metrics``)
    tell a window whose answers reached the client in bursts, or late, from a fast one, whatever the number of
    chunks (see `record_latencies`)."""
    tol = tolerances or Tolerances()
    metrics = window.metrics
    record_latencies(perf, window, tol, e2el=True, engine_tpot_ms=engine_tpot_ms, engine_ttft_ms=engine_ttft_ms,
                     tails=tails)
    th = tol.throughput
    perf.record("request_throughput", metrics.request_throughput, unit="req/s", better="higher", tolerance=th)
    perf.record("output_throughput", metrics.output_throughput, unit="tok/s", better="higher", tolerance=th)
    perf.record("total_token_throughput", metrics.total_token_throughput, unit="tok/s", better="higher", tolerance=th)
    if metrics.request_goodput is not None:
        perf.record("request_goodput", metrics.request_goodput, unit="req/s", better="higher", tolerance=th)
    failures = whole or metrics
    perf.record(
        "failed_rate",
        failures.failed_rate,
        unit="ratio",
        better="lower",
        tolerance=0.0,
        abs_tolerance=allowed_failed_rate,
    )
    check_failures(failures, allowed_failed_rate)


def record_latencies(perf: PerfRecorder, window: WindowResult, tol: Tolerances, *, e2el: bool,
                     engine_tpot_ms: float | None = None, engine_ttft_ms: float | None = None,
                     tails: Sequence[float] = ()) -> None:
    """TTFT (and E2EL) per request, their medians judged, and their means (``*_mean_ms``: the server's figures are
    means); client TPOT per request and its mean, and pooled mean ITL, unless the stream coalesced (judged against the
    engine's TPOT too when the server exports it); the ``tails`` percentiles of TTFT, ITL (unless
    coalesced) and E2EL with their order-statistic bounds. A coalesced window, or one whose first tokens reached
    the client far later than the engine's TTFT, makes the window's client-timed metrics INCONCLUSIVE
    (`Perf.inconclusive`)."""
    samples = latency_samples(window.outcomes)
    # On a box where the load generator, the API server and the engine share the cores, the server falls behind
    # and sends whole answers at once, or the first token late: client TTFT becomes the delivery delay (seen 21 ->
    # 233 ms and 51 -> 439 ms on 2 cores, in some rounds and not others). The window measured the apparatus.
    lumped = coalesced(window.outcomes, engine_tpot_ms)
    reasons = [r for r in (lumped, delivery_delayed(window.outcomes, engine_ttft_ms)) if r is not None]
    if reasons:
        perf.context(client_timing="; ".join(reasons))
        for reason in reasons:
            perf.inconclusive(reason, only=CLIENT_TIMED)
    if samples["ttft"]:
        perf.record("ttft_ms", samples["ttft"], unit="ms", better="lower", tolerance=tol.ttft)
        perf.record("ttft_mean_ms", stats.mean(samples["ttft"]), unit="ms", better="lower", tolerance=tol.ttft)
    if lumped is None:
        if samples["tpot"]:
            perf.record("tpot_ms", samples["tpot"], unit="ms", better="lower", tolerance=tol.latency)
            perf.record("tpot_mean_ms", stats.mean(samples["tpot"]), unit="ms", better="lower",
                        tolerance=tol.latency)
        if window.metrics.itl_ms.count:
            perf.record("itl_mean_ms", window.metrics.itl_ms.mean, unit="ms", better="lower", tolerance=tol.latency)
    if e2el and samples["e2el"]:
        perf.record("e2el_ms", samples["e2el"], unit="ms", better="lower", tolerance=tol.latency)
        perf.record("e2el_mean_ms", stats.mean(samples["e2el"]), unit="ms", better="lower", tolerance=tol.latency)
    requests = len(samples["ttft"])
    for metric in ("ttft", "itl", "e2el"):
        if (metric == "itl" and lumped is not None) or (metric == "e2el" and not e2el) or not samples[metric]:
            continue
        for pct in tails:
            bound = tail_bound(metric, samples[metric], pct, requests)
            perf.record(bound.name, bound.value, unit="ms", better="lower", context=bound.context(),
                        tolerance=tol.ttft if metric == "ttft" else tol.latency)
            unbounded = bound.unbounded
            if unbounded is not None:
                perf.inconclusive(unbounded, only=[bound.name])


def record_window_facts(perf: PerfRecorder, result: SpecWindow, tol: Tolerances) -> None:
    """Context first (it applies to what is recorded after): the warm pass's cost, the plateau (what was set aside
    at each end, `pytest_moeperf.serving.analysis.plateau`), the drift check's outcome on the plateau (and, when the
    window drifted, its `CLIENT_TIMED` metrics INCONCLUSIVE), what the server counted and over which span, and the
    client/server ratios of TPOT and TTFT (`pytest_moeperf.serving.analysis.agreement`)."""
    outcomes = result.window.outcomes  # the plateau's
    block = result.plateau.edge if result.plateau is not None else 1
    drift = check_drift(outcomes, ramp=0, block=max(1, block), min_effects={"ttft": tol.ttft, "tpot": tol.latency})
    compiles = result.compiles
    plateau = result.plateau.facts() if result.plateau is not None else {}
    perf.context(**result.warm.context(), **plateau, **drift.facts(), engine_requests=result.engine.requests,
                 engine_output_tokens=result.engine.output_tokens, engine_span=result.engine_span,
                 window_compiles=compiles.count if compiles.checked else None,
                 **agreement.facts(agreement.agreements(outcomes, result.engine)))
    reason = drift.reason()
    if reason is not None:
        perf.inconclusive(reason, only=CLIENT_TIMED)
    shortfall = batch_shortfall(result)
    if shortfall is not None:
        perf.context(batch_shortfall=shortfall)
        perf.inconclusive(shortfall, only=(*CLIENT_TIMED, *BATCH_BOUND))
    if compiles.count:  # the server's own figures over the window met the compiles too
        perf.inconclusive(f"the server logged {compiles.describe()} while the window ran (the window "
                          f"measured Triton's just-in-time compiles of new batch shapes, not the server; its warm "
                          f"passes did not reach every shape)", only=(*CLIENT_TIMED, *ENGINE_METRICS))


def batch_shortfall(result: SpecWindow) -> str | None:
    """Why a closed-loop window did not measure its concurrency (None: it did): its engine steps carried fewer than
    `BATCH_SHARE` of its C clients' sequences on average (output tokens over steps, over the tokens a sequence gains
    a step: its acceptance length, 1 without speculation). Seen on the 2-core CPU box (canary_check runs of
    2026-12-06, n-gram at C = 4): in 20 of 40 windows the answers reached the client ~400 ms after the engine's
    5-10 ms TTFT, each client's next request came after the others had finished, and the steps carried 0.93
    sequences: tokens a step 3.58 against 13.8 in the other windows, decided as a x3.8 regression by the gross rule.
    Such a window measured batch 1 under a C = 4 label: what the batch sets (`BATCH_BOUND`) is INCONCLUSIVE."""
    shape, engine = result.window.shape, result.engine
    if not isinstance(shape, ClosedLoop) or shape.concurrency < 2 or not engine.steps or not engine.output_tokens:
        return None
    per_sequence = result.acceptance.mean_acceptance_length if result.acceptance is not None else 1.0
    batch = engine.output_tokens / engine.steps / max(per_sequence, 1.0)
    if batch >= BATCH_SHARE * shape.concurrency:
        return None
    return (f"the engine's steps carried {batch:.2f} sequences on average, under {BATCH_SHARE:g} of the "
            f"{shape.concurrency} the closed loop keeps in flight (the clients' next requests came after the others "
            "had finished: the load generator or the box did not load the server as asked): the window measured "
            "another batch, its engine and step metrics INCONCLUSIVE")


def record_engine(perf: PerfRecorder, engine: EngineFigures, tol: Tolerances) -> None:
    """The server's own means over the window's plateau (``engine_*_mean_ms``,
    `pytest_moeperf.serving.analysis.arbiter`)."""
    for name, value in engine.metrics().items():
        tolerance = tol.ttft if name == "engine_ttft_mean_ms" else tol.latency
        perf.record(name, value, unit="ms", better="lower", tolerance=tolerance,
                    abs_tolerance=QUEUE_ABS_MS if name == "engine_queue_mean_ms" else None)


def record_window(perf: PerfRecorder, result: SpecWindow, tolerances: Tolerances | None = None, *,
                  tails: Sequence[float] = (), allowed_failed_rate: float = 0.0) -> None:
    """A serving window, all of it: its facts (warm pass, drift), latencies and tails, the server's figures,
    throughputs and failed rate; then the failure gate."""
    tol = tolerances or Tolerances()
    record_window_facts(perf, result, tol)
    record_engine(perf, result.engine, tol)
    record_serving(perf, result.window, tol, allowed_failed_rate=allowed_failed_rate,
                   engine_tpot_ms=result.engine_tpot_ms, engine_ttft_ms=result.engine_ttft_ms, tails=tails,
                   whole=result.all_requests.metrics)


def record_acceptance(perf: PerfRecorder, stats: AcceptanceStats, tolerances: Tolerances | None = None) -> None:
    ta = (tolerances or Tolerances()).acceptance
    perf.record("acceptance_length", stats.mean_acceptance_length, unit="tokens", better="higher", tolerance=ta)
    perf.record("acceptance_rate", stats.acceptance_rate, unit="ratio", better="higher", tolerance=ta)
