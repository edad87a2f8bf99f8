"""A budget as Markdown lines or as a report :class:`~pytest_moeperf.ledger.Section`; nothing here prints."""

from __future__ import annotations

from pytest_moeperf.kernels.budget.calc import NOT_MODELLED, Budget, build_budget
from pytest_moeperf.kernels.budget.inputs import inputs_from_measurements
from pytest_moeperf.kernels.budget.sources import Candidate, choose_allreduce
from pytest_moeperf.kernels.models import get_model
from pytest_moeperf.ledger import Measurement, Section
from pytest_moeperf.reports.markdown import markdown_table, md_text

__all__ = ["budget_lines", "budget_section", "budget_sections_from", "budget_table", "headline"]


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def budget_table(budget: Budget) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    columns: tuple[str, ...] = ("component", "op", "count/step", "each (us)", "total (us)", "share %", "source")
    rows: list[tuple[str, ...]] = [(r.component, r.op, str(r.count), _num(r.each_us), _num(r.total_us),
                                    "-" if r.share_pct is None else f"{r.share_pct:.1f}", r.source)
                                   for r in budget.rows]
    return columns, rows


def _by_component(budget: Budget) -> list[tuple[str, float, float]]:
    totals: dict[str, float] = {}
    for r in budget.rows:
        if r.total_us is not None:
            totals[r.component] = totals.get(r.component, 0.0) + r.total_us
    return [(c, t, 100.0 * t / budget.total_us if budget.total_us else 0.0) for c, t in totals.items()]


def headline(budget: Budget) -> str:
    """The step the budget models, in one line: with its all-reduce share, or saying it has no all-reduce."""
    share = budget.allreduce_share_pct
    if budget.without_allreduce:
        ar = next(r for r in budget.rows if r.component == "all-reduce")
        return (f"Modelled step time without all-reduce: {budget.total_us:.4g} us per rank (TP={budget.tp}: "
                f"{ar.count} all-reduces of {ar.op} a step not included)")
    return f"Modelled step time: {budget.total_us:.4g} us per rank" + (
        f" (all-reduce share {share:.1f} %)" if share else "")


def budget_lines(budget: Budget) -> list[str]:
    """A Markdown rendering (title, op table, per-component summary, caveats)."""
    columns, rows = budget_table(budget)
    lines = [f"## Decode-step budget: {md_text(budget.model)}, TP={budget.tp}, batch={budget.batch}", ""]
    lines += markdown_table(columns, rows)
    lines += [""] + markdown_table(("component", "total (us)", "share %"),
                                   [(c, f"{t:.4g}", f"{s:.1f}") for c, t, s in _by_component(budget)])
    lines += ["", headline(budget)]
    if budget.without_allreduce:
        lines.append(f"All-reduce left out: {budget.without_allreduce}.")
    if budget.missing:
        lines.append(f"Incomplete: no time for {', '.join(budget.missing)} (left out of the total).")
    lines.append(f"Not modelled: {NOT_MODELLED}; the real step is longer than this sum.")
    return lines


def budget_section(budget: Budget) -> Section:
    columns, rows = budget_table(budget)
    note = (f"step {budget.total_us:.4g} us per rank"
            + (f" without all-reduce ({budget.without_allreduce})" if budget.without_allreduce else "")
            + f"; not modelled: {NOT_MODELLED}"
            + (f"; no time for {', '.join(budget.missing)}" if budget.missing else ""))
    return Section(f"Decode-step budget: {budget.model} TP={budget.tp} batch={budget.batch}", columns,
                   tuple(rows), note)


def budget_sections_from(measurements: list[Measurement]) -> list[Section]:
    """A budget table per (model, tp, batch) this session measured GEMMs for, when it also measured
    all-reduces (batch sizes: the GEMM ``m`` values; all-reduce latency interpolated by message size). The
    all-reduce term follows :func:`~pytest_moeperf.kernels.budget.sources.choose_allreduce`: gloo or fewer ranks
    than the TP degree leave the step without it, saying why."""
    pieces, points = inputs_from_measurements(measurements)
    if not pieces or not points:
        return []
    sections = []
    for model, tp in sorted({(p.model, p.tp) for p in pieces}):
        try:
            spec = get_model(model)
        except KeyError:
            continue
        choice = choose_allreduce(tp, [Candidate("this run", tuple(points))])
        for batch in sorted({p.m for p in pieces if p.model == model and p.tp == tp}):
            budget = build_budget(spec, tp, batch, pieces, choice.points or None, without_allreduce=choice.without)
            if not budget.missing:
                sections.append(budget_section(budget))
    return sections
