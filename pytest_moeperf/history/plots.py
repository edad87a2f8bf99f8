"""Pictures as bytes (PNG or SVG), drawn with matplotlib's Agg canvas (no display, no pyplot state): a metric's
trend, and a session's Δ % per metric against its tolerance."""

from __future__ import annotations

import functools
import io
from collections.abc import Callable, Sequence
from typing import Any, ParamSpec, TypeVar

from pytest_moeperf.history.records import MetricRecord
from pytest_moeperf.history.trend import Trend
from pytest_moeperf.reports.controls import visible

FORMATS = ("png", "svg")
STATUS_STYLE: dict[str, tuple[str, str]] = {  # verdict -> (colour, marker)
    "PASS": ("#2e7d32", "o"), "IMPROVED": ("#1565c0", "^"), "REGRESSED": ("#c62828", "X"),
    "NEW": ("#757575", "s"), "INCONCLUSIVE": ("#ef6c00", "D"), "MISSING": ("#6a1b9a", "v"),
}
OTHER_STYLE = ("#9e9e9e", "P")
P = ParamSpec("P")
R = TypeVar("R")
SEVERITY = {"REGRESSED": 0, "INCONCLUSIVE": 1, "MISSING": 2, "IMPROVED": 3, "NEW": 4, "PASS": 5}


def plain(text: object) -> str:
    """``text`` as matplotlib shows it, verbatim: each ``$`` escaped, so that a metric name, unit, key or verdict
    from a report is never read as mathtext (``$\\undefinedcmd$`` in a unit raised, and lost the whole HTML report).
    matplotlib turns ``\\$`` back into ``$`` in text that is not mathtext; TeX is off (`_drawing`). Control
    characters are escaped (`visible`), as in the report's text."""
    return visible(text).replace("$", r"\$")


def _drawing(draw: Callable[P, R]) -> Callable[P, R]:
    """Draw with TeX off whatever the user's matplotlibrc says: with ``text.usetex`` every label would go through
    LaTeX (which may not be installed) and read ``%``, ``_``, ``#`` and ``\\`` in it as TeX."""

    @functools.wraps(draw)
    def drawn(*args: P.args, **kwargs: P.kwargs) -> R:
        from matplotlib import rc_context

        with rc_context({"text.usetex": False}):
            return draw(*args, **kwargs)

    return drawn


def _figure(width: float, height: float) -> Any:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100, layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def _bytes(figure: Any, fmt: str) -> bytes:
    if fmt not in FORMATS:
        raise ValueError(f"plot format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    buffer = io.BytesIO()
    figure.savefig(buffer, format=fmt, metadata={"Date": None} if fmt == "svg" else {"Software": None})
    return buffer.getvalue()


def short(text: str, width: int) -> str:
    return text if len(text) <= width else "…" + text[-(width - 1):]


@_drawing
def trend_plot(trend: Trend, fmt: str = "png") -> bytes:
    """Median per run (IQR as error bars, marker by verdict), the baseline each run was judged against with its
    tolerance band, and Otava's change points with the size of each step."""
    points = trend.points
    xs = list(range(len(points)))
    medians = [p.metric.median for p in points]
    figure = _figure(9.0, 3.6)
    axes = figure.add_subplot()
    axes.plot(xs, medians, color="#455a64", linewidth=1.0, zorder=1)
    axes.errorbar(xs, medians, yerr=[p.metric.iqr / 2 for p in points], fmt="none", ecolor="#90a4ae", zorder=1)
    for status in sorted({p.metric.status for p in points}, key=lambda s: SEVERITY.get(s, 9)):
        colour, marker = STATUS_STYLE.get(status, OTHER_STYLE)
        chosen = [i for i, p in enumerate(points) if p.metric.status == status]
        axes.scatter(chosen, [medians[i] for i in chosen], color=colour, marker=marker, s=36, zorder=3,
                     label=plain(status))
    baseline = [p.metric.baseline for p in points]
    if any(b is not None for b in baseline):
        base = [float("nan") if b is None else b for b in baseline]
        axes.step(xs, base, where="mid", color="#000000", linestyle="--", linewidth=1.0, label="baseline")
        allowed = [p.metric.allowed or 0.0 for p in points]
        axes.fill_between(xs, [b * (1 - a) for b, a in zip(base, allowed, strict=True)],
                          [b * (1 + a) for b, a in zip(base, allowed, strict=True)], step="mid", color="#000000",
                          alpha=0.08, label="tolerance")
    for number, step in enumerate(trend.steps):
        axes.axvline(step.index - 0.5, color="#d81b60", linestyle=":", linewidth=1.5,
                     label="change point" if number == 0 else None)
        relative = step.relative
        axes.annotate("" if relative is None else f"{relative * 100:+.1f} %", (step.index - 0.5, 1.0),
                      xycoords=("data", "axes fraction"), xytext=(3, -12), textcoords="offset points",
                      color="#d81b60", fontsize=8)
    ticks = xs if len(xs) <= 12 else xs[:: max(1, len(xs) // 12)]
    axes.set_xticks(ticks, [plain(f"#{points[i].run.id}\n{points[i].run.run.finished[:10]}") for i in ticks],
                    fontsize=7)
    unit = points[0].metric.unit if points else ""
    better = points[0].metric.better if points else "lower"
    axes.set_ylabel(plain(f"{unit} ({better} is better)"))
    axes.set_title(plain(f"{short(trend.key, 90)}\n{trend.fingerprint}"), fontsize=9)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=7, loc="best")
    return _bytes(figure, fmt)


def _rank(metric: MetricRecord) -> tuple[int, float]:
    allowed = metric.allowed or 0.0
    scale = abs(metric.change or 0.0) / allowed if allowed else abs(metric.change or 0.0)
    return SEVERITY.get(metric.status, 9), -scale


@_drawing
def session_plot(metrics: Sequence[MetricRecord], fmt: str = "png", limit: int = 30) -> tuple[bytes, str]:
    """Δ % of each judged metric against its baseline (dot, by verdict) over its tolerance (grey bar, ± allowed):
    the picture of the verdict table. Shows the ``limit`` most telling metrics (worst verdicts, then the largest
    change relative to its tolerance); returns the image and a caption that says what was left out."""
    judged = sorted((m for m in metrics if m.change is not None), key=_rank)
    shown = judged[:limit]
    figure = _figure(10.0, 1.0 + 0.2 * max(len(shown), 1))
    axes = figure.add_subplot()
    rows = list(range(len(shown)))[::-1]  # the worst at the top
    for row, metric in zip(rows, shown, strict=True):
        allowed = (metric.allowed or 0.0) * 100
        axes.barh(row, 2 * allowed, left=-allowed, height=0.6, color="#cfd8dc", zorder=1)
        colour, marker = STATUS_STYLE.get(metric.status, OTHER_STYLE)
        axes.scatter([(metric.change or 0.0) * 100], [row], color=colour, marker=marker, s=30, zorder=3)
    axes.axvline(0.0, color="#000000", linewidth=0.8)
    axes.set_yticks(rows, [plain(short(f"{m.key} ({m.better})", 70)) for m in shown], fontsize=7)
    axes.set_xlabel("Δ % against the baseline median (grey: tolerance ±)")
    for status in sorted({m.status for m in shown}, key=lambda s: SEVERITY.get(s, 9)):
        colour, marker = STATUS_STYLE.get(status, OTHER_STYLE)
        axes.scatter([], [], color=colour, marker=marker, label=plain(status))
    if shown:
        axes.legend(fontsize=7, loc="lower right")
    else:
        axes.text(0.5, 0.5, "no metric has a baseline to compare with", ha="center", transform=axes.transAxes)
    axes.grid(True, axis="x", alpha=0.3)
    unjudged = len(metrics) - len(judged)
    caption = f"{len(shown)} of {len(judged)} judged metric(s) shown"
    caption += f"; {unjudged} without a baseline (NEW) not drawn" if unjudged else ""
    return _bytes(figure, fmt), caption
