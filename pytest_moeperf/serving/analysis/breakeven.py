"""The break-even acceptance of a drafter: the mean acceptance length at which speculative decoding's TPOT equals the
TPOT without it, fitted from windows at several pinned lengths (pure).

A speculative decode step of one sequence costs about the same whatever the drafts it accepts (the drafter's k
forward passes and the verify pass of k + 1 tokens run either way; only the accept decision differs), and it emits
L tokens on average, so TPOT(L) = a / L + b: ``a`` the step's time per sequence, ``b`` what each emitted token costs
on top (sampling, detokenizing, the output path). `fit_tpot` fits a and b by least squares on x = 1 / L (ordinary
linear regression), from at least 3 points (L measured from ``/metrics``, TPOT the engine's) of one drafter, k and
concurrency. Against the TPOT of the no-spec server at the same concurrency, T0, the break-even is where the line
meets it: L* = a / (T0 - b) (`break_even`). Below L* the drafts cost more than they save; a change that makes the
drafter or the verify step dearer raises a (or b) and so L*: lower is better, a rise is a regression.

* ``a <= 0`` (TPOT does not fall as acceptance rises): no break-even to fit (``undefined``), the points are noise
  or the knob did not take;
* ``b >= T0``: ``never``: even accepting every draft would not reach the no-spec TPOT;
* L* above k + 1 is reported as it is: no acceptance this k can reach pays for the drafts.

The 95 % interval is the delta method's on the fit's covariance (residual variance with n - 2 degrees of freedom,
Student's t): wide with 3 points (one degree of freedom: t = 12.7), and T0's own noise is left out (one window).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = ["AT", "NEVER", "UNDEFINED", "BreakEven", "Fit", "Point", "break_even", "fit_tpot", "t_quantile"]

AT = "at"
NEVER = "never"
UNDEFINED = "undefined"
MIN_POINTS = 3


@dataclass(frozen=True)
class Point:
    """One window of a pinned drafter: its mean acceptance length (from ``/metrics``) and TPOT (ms)."""

    acceptance_length: float
    tpot_ms: float


@dataclass(frozen=True)
class Fit:
    """TPOT(L) = a / L + b, ms; ``var_a``, ``var_b``, ``cov_ab`` the estimates' (co)variances (None: no residual
    degree of freedom), ``df`` the residual degrees of freedom."""

    a: float
    b: float
    n: int
    df: int
    residual_sd: float | None = None
    var_a: float | None = None
    var_b: float | None = None
    cov_ab: float | None = None

    def tpot_ms(self, acceptance_length: float) -> float:
        return self.a / acceptance_length + self.b


@dataclass(frozen=True)
class BreakEven:
    """Where the fit meets the no-spec TPOT: ``status`` `AT` (``value`` and maybe its interval), `NEVER` or
    `UNDEFINED`; ``reason`` says which and why, with the numbers."""

    status: str
    fit: Fit
    nospec_tpot_ms: float
    value: float | None = None
    low: float | None = None
    high: float | None = None
    reason: str = ""


def fit_tpot(points: Sequence[Point]) -> Fit:
    """Least squares of TPOT on 1 / L. Raises ValueError with fewer than 2 distinct lengths or a bad point."""
    for p in points:
        if not (p.acceptance_length >= 1.0 and p.tpot_ms > 0 and math.isfinite(p.tpot_ms)):
            raise ValueError(f"point {p}: acceptance length must be >= 1 and TPOT a positive number")
    xs = [1.0 / p.acceptance_length for p in points]
    ys = [p.tpot_ms for p in points]
    n = len(points)
    if n < 2 or max(xs) - min(xs) < 1e-12:
        raise ValueError(f"a fit of TPOT on acceptance needs 2 or more distinct lengths, got "
                         f"{sorted({p.acceptance_length for p in points})}")
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx
    b = my - a * mx
    df = n - 2
    if df < 1:
        return Fit(a, b, n, df)
    sse = sum((y - (a * x + b)) ** 2 for x, y in zip(xs, ys, strict=True))
    s2 = sse / df
    return Fit(a, b, n, df, residual_sd=math.sqrt(s2), var_a=s2 / sxx, var_b=s2 * (1.0 / n + mx * mx / sxx),
               cov_ab=-mx * s2 / sxx)


def break_even(fit: Fit, nospec_tpot_ms: float, confidence: float = 0.95) -> BreakEven:
    """The acceptance length at which ``fit`` equals ``nospec_tpot_ms``, with its interval where the fit has one."""
    where = (f"TPOT(L) = {fit.a:.4g} / L + {fit.b:.4g} ms from {fit.n} points, no-spec TPOT "
             f"{nospec_tpot_ms:.4g} ms")
    if fit.a <= 0:
        return BreakEven(UNDEFINED, fit, nospec_tpot_ms, reason=f"TPOT does not fall as acceptance rises ({where}): "
                         "no break-even to fit (noise, or the pinned acceptance did not take)")
    gap = nospec_tpot_ms - fit.b
    if gap <= 0:
        return BreakEven(NEVER, fit, nospec_tpot_ms, reason=f"never: even accepting every draft, TPOT stays above "
                         f"{fit.b:.4g} ms, the no-spec TPOT or more ({where})")
    value = fit.a / gap
    low = high = None
    if fit.var_a is not None and fit.var_b is not None and fit.cov_ab is not None:
        da, db = 1.0 / gap, fit.a / gap ** 2  # dL*/da, dL*/db
        var = da * da * fit.var_a + 2 * da * db * fit.cov_ab + db * db * fit.var_b
        half = t_quantile(0.5 + confidence / 2, fit.df) * math.sqrt(max(var, 0.0))
        low, high = max(1.0, value - half), value + half
    return BreakEven(AT, fit, nospec_tpot_ms, value=value, low=low, high=high,
                     reason=f"break-even at L = {value:.3g} ({where})")


def t_quantile(q: float, df: int) -> float:
    """Student's t quantile (``q`` in (0.5, 1), ``df`` >= 1): bisection on the CDF, integrated numerically."""
    if not 0.5 < q < 1.0 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 < q < 1 and df >= 1, got q={q}, df={df}")
    lo, hi = 0.0, 1.0
    while _t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(60):
        mid = (lo + hi) / 2.0
        lo, hi = (mid, hi) if _t_cdf(mid, df) < q else (lo, mid)
    return (lo + hi) / 2.0


def _t_cdf(t: float, df: int) -> float:
    """P(T <= t) for t >= 0: 1/2 plus Simpson's rule over the density from 0 to t, in the variable u = atan(x), whose
    integrand stays smooth however far t is."""
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)
    top = math.atan(t / math.sqrt(df))
    steps = 400

    def f(u: float) -> float:  # x = sqrt(df) tan u: density(x) dx = c cos(u)^(df - 1) sqrt(df) du
        return math.exp(log_c) * math.sqrt(df) * math.cos(u) ** (df - 1)

    h = top / steps
    total = f(0.0) + f(top) + sum((4 if i % 2 else 2) * f(i * h) for i in range(1, steps))
    return 0.5 + total * h / 3.0
