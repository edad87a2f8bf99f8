"""What a speculative-decoding window records beyond a serving window, the break-even acceptance, and the report's
tables of both.

Per window (`record_pinned`, `record_steps`):

* a profile that pins its acceptance (`pytest_moeperf.serving.models.acceptance`) must measure it: the window's
  acceptance length from ``/metrics`` is checked against the pinned one (`specdecode.pinned_miss`, +-2 %); a window
  where the knob did not take is INCONCLUSIVE, all of it, with that reason, and says so in a warning line;
* ``engine_step_ms``: the time of one decode step of a sequence, the engine's mean TPOT times the tokens such a step
  emits per sequence (the mean acceptance length; 1 without speculation): what a step of k drafts and a verify pass
  of k + 1 tokens costs, whatever the acceptance;
* ``tokens_per_step``: the output tokens of the plateau over vLLM's engine steps in it (``EngineFigures.steps``):
  what a step emits across the batch (about concurrency x acceptance length).

Across windows (`record_break_even`): the break-even acceptance of a pinned profile at a concurrency, fitted from
its windows at 3 or more acceptance lengths (the profile and its ``--moeperf-acceptance-lengths`` variants) against
its reference's window (`pytest_moeperf.serving.analysis.breakeven`), recorded as ``break_even_acceptance_length``
(tokens, lower is better: a rise is a regression).

Tables (`spec_sections`): the draft candidates (acceptance, TPOT, throughput, speed-up per profile and concurrency)
and the break-even acceptance per drafter, k and concurrency.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from pytest_moeperf.ledger import Measurement, Section
from pytest_moeperf.serving.analysis.breakeven import BreakEven, Point
from pytest_moeperf.serving.analysis.metrics import percentile
from pytest_moeperf.serving.analysis.specdecode import AcceptanceStats, CandidateRow, comparison_table, pinned_miss
from pytest_moeperf.serving.lifecycle.served import SpecWindow
from pytest_moeperf.serving.models.profiles import ServeProfile, Tolerances
from pytest_moeperf.serving.recording import PerfRecorder

__all__ = ["BREAK_EVEN", "STEP_METRICS", "PinnedAcceptanceWarning", "candidate_section", "record_break_even",
           "record_pinned", "record_steps", "spec_sections"]

STEP_METRICS = ("engine_step_ms", "tokens_per_step")
BREAK_EVEN = "break_even_acceptance_length"


class PinnedAcceptanceWarning(UserWarning):
    """A window of a pinned profile measured another acceptance than the pinned one."""


def record_pinned(perf: PerfRecorder, profile: ServeProfile, stats: AcceptanceStats) -> str | None:
    """The pinned length in the window's context, and the window INCONCLUSIVE (with a warning line) when its
    acceptance from ``/metrics`` is not it; returns that reason (None: it took, or the profile pins nothing)."""
    pinned = profile.pinned_acceptance
    if pinned is None:
        return None
    perf.context(pinned_acceptance_length=pinned)
    miss = pinned_miss(pinned, profile.speculative_tokens, stats)
    perf.context(pinned_acceptance="took" if miss is None else "did not take")
    if miss is not None:
        perf.inconclusive(miss)
        warnings.warn(PinnedAcceptanceWarning(f"{profile.name}: {miss}"), stacklevel=2)
    return miss


def record_steps(perf: PerfRecorder, result: SpecWindow, tol: Tolerances) -> None:
    """``engine_step_ms`` and ``tokens_per_step`` of the window (what the server exports of them); INCONCLUSIVE where
    the server compiled kernels during the window, as its own figures are."""
    per_sequence = result.acceptance.mean_acceptance_length if result.acceptance is not None else 1.0
    engine = result.engine
    perf.context(engine_steps=engine.steps, step_tokens_per_sequence=round(per_sequence, 4))
    if result.compiles.count:
        perf.inconclusive(f"the server logged {result.compiles.describe()} while the window ran: its steps met "
                          "Triton's just-in-time compiles", only=STEP_METRICS)
    if result.engine_tpot_ms is not None:
        perf.record("engine_step_ms", result.engine_tpot_ms * per_sequence, unit="ms", better="lower",
                    tolerance=tol.latency)
    if engine.steps and engine.output_tokens is not None:
        perf.record("tokens_per_step", engine.output_tokens / engine.steps, unit="tokens", better="higher",
                    tolerance=tol.throughput)


def record_break_even(perf: PerfRecorder, profile: ServeProfile, found: BreakEven, points: Sequence[Point]) -> None:
    """``break_even_acceptance_length`` of ``profile`` (a finite break-even: `AT`), its fit in the context."""
    fit = found.fit
    perf.context(fit_a_ms=round(fit.a, 5), fit_b_ms=round(fit.b, 5), fit_points=fit.n,
                 fit_residual_sd_ms=None if fit.residual_sd is None else round(fit.residual_sd, 5),
                 points="; ".join(f"{p.acceptance_length:.3f}: {p.tpot_ms:.4g} ms"
                                  for p in sorted(points, key=lambda p: p.acceptance_length)),
                 reference_tpot_ms=round(found.nospec_tpot_ms, 5), break_even=found.status,
                 break_even_low=_rounded(found.low), break_even_high=_rounded(found.high),
                 pinned_acceptance_length=profile.pinned_acceptance)
    assert found.value is not None, found.reason
    perf.record(BREAK_EVEN, found.value, unit="tokens", better="lower", tolerance=profile.tolerances.acceptance)


def spec_sections(measurements: Sequence[Measurement]) -> list[Section]:
    """The draft-candidate table and the break-even table, each where something was recorded for it."""
    return [*candidate_section(measurements), *break_even_section(measurements)]


def candidate_section(measurements: Sequence[Measurement]) -> list[Section]:
    """The draft-candidate table of the spec-decode tests."""
    groups: dict[tuple[str, int], dict[str, Measurement]] = {}
    methods: dict[tuple[str, int], str] = {}
    for m in measurements:
        ctx = m.context
        if "spec_method" not in ctx or not isinstance(ctx.get("concurrency"), int):
            continue
        key = (str(ctx["profile"]), int(ctx["concurrency"]))  # type: ignore[arg-type]
        groups.setdefault(key, {})[m.name] = m
        methods[key] = str(ctx["spec_method"])
    rows = []
    for key, metrics in groups.items():
        if "output_throughput" not in metrics:
            continue

        def median(name: str, metrics: dict[str, Measurement] = metrics) -> float | None:
            found = metrics.get(name)
            return None if found is None else percentile(found.samples, 50.0)

        rows.append(
            CandidateRow(
                profile=key[0],
                method=methods[key],
                concurrency=key[1],
                tpot_ms=median("engine_tpot_mean_ms") or median("tpot_ms") or 0.0,
                output_throughput=median("output_throughput") or 0.0,
                acceptance_length=median("acceptance_length"),
                acceptance_rate=median("acceptance_rate"),
                speedup=median("speedup"),
            )
        )
    if not rows:
        return []
    columns, table = comparison_table(rows)
    note = (
        "TPOT: the engine's mean over the window where the server exports it, else the client's median; "
        "speedup: median over rounds, by the method named in each test's context (speedup_method)"
    )
    return [Section("Speculative decoding: draft candidates", columns, tuple(table), note)]


BREAK_EVEN_COLUMNS = ("profile", "drafter", "k", "concurrency", "points (L: TPOT)", "no-spec TPOT ms",
                      "TPOT(L) fit, ms", "break-even L", "95 % interval")


def break_even_section(measurements: Sequence[Measurement]) -> list[Section]:
    """Per drafter, k and concurrency: the break-even acceptance (the median of its rounds) and its fit."""
    by_test: dict[str, list[Measurement]] = {}
    for m in measurements:
        if m.name == BREAK_EVEN:
            by_test.setdefault(m.test_id, []).append(m)
    rows = []
    for found in by_test.values():
        ctx = found[-1].context
        value = percentile([s for m in found for s in m.samples], 50.0)
        k = ctx.get("num_speculative_tokens")
        beyond = " (above k + 1: no acceptance pays)" if isinstance(k, int) and value > k + 1 else ""
        low, high = ctx.get("break_even_low"), ctx.get("break_even_high")
        rows.append((str(ctx.get("profile", "")), str(ctx.get("spec_method", "")), str(k), str(ctx.get("concurrency")),
                     str(ctx.get("points", "")), str(ctx.get("reference_tpot_ms", "")),
                     f"{ctx.get('fit_a_ms')} / L + {ctx.get('fit_b_ms')}", f"{value:.3g}{beyond}",
                     "-" if low is None or high is None else f"{low} to {high}"))
    if not rows:
        return []
    note = ("the mean acceptance length at which spec decode's TPOT (the engine's) equals the no-spec reference's at "
            "the same concurrency in the same start: TPOT(L) = a / L + b fitted by least squares on the windows at "
            "3 or more pinned lengths (the profile and its --moeperf-acceptance-lengths variants), L* = a / (T0 - b); "
            "interval: delta method, Student's t with n - 2 degrees of freedom; lower is better")
    rows.sort(key=lambda r: (r[0], int(r[3]) if r[3].isdigit() else 0))
    return [Section("Speculative decoding: break-even acceptance", BREAK_EVEN_COLUMNS, tuple(rows), note)]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)
