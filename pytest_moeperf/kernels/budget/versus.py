"""A budget beside a measured decode step (pure): the share of the step the budget explains, and what is left.

The measured step is one rank's decode step at the budget's batch, seen two ways:

* *traced*: a ``moeperf attribute`` record: the profiled step split into all-reduce, routed-expert GEMM, dense
  GEMM, attention, other and GPU idle (launch gaps); the profiler's own cost is inside it;
* *served*: a serving window's engine TPOT (closed loop at concurrency = batch): the step as it runs, no split.
  Traced ÷ served is the profiler's inflation.

The budget's rows meet the trace's components: its attention projections, dense MLP, shared expert, router and
LM head are the trace's dense GEMMs, its routed experts the routed-expert GEMMs, its all-reduces the all-reduce.
What the budget does not model and the trace measures is listed apart: attention core, other (norms, rope, top-k,
activation, sampling), GPU idle. A measured step that runs no all-reduce (a TP=1 rank profile) is compared with
the budget less its all-reduce, said so.

:func:`scaled` carries a measured step to another box: its GEMMs × the datasheet bandwidth ratio (what the budget
does to its GEMM pieces), attention core, other and idle as measured (latency-bound kernels and host time, which
bandwidth does not set), plus the target budget's all-reduce from its named source. Every such figure is labelled.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from pytest_moeperf.attribution.classify import ALL_REDUCE, ATTENTION, DENSE, OTHER, ROUTED
from pytest_moeperf.kernels.budget.calc import Budget
from pytest_moeperf.kernels.models import ModelSpec, rank_gemms
from pytest_moeperf.reports.markdown import markdown_table, md_text

__all__ = ["MeasuredStep", "Part", "Versus", "scaled", "shape_mismatch", "versus", "versus_lines"]

#: budget components → the trace component they are measured as
GEMM_PARTS: tuple[tuple[str, frozenset[str], str], ...] = (
    ("dense GEMMs (attention projections, dense MLP, shared expert, router, LM head)",
     frozenset({"attention", "dense_mlp", "shared_expert", "router", "lm_head"}), DENSE),
    ("routed-expert GEMMs", frozenset({"routed_experts"}), ROUTED),
)
#: what the trace measures and the budget does not model
UNMODELLED: tuple[tuple[str, str], ...] = (("attention core (KV-cache read)", ATTENTION),
                                           ("other: norms, rope, top-k, activation, sampling", OTHER))
#: components a bandwidth ratio carries to another box (decode GEMMs read their weights once)
BANDWIDTH_BOUND = (DENSE, ROUTED)


@dataclass(frozen=True)
class MeasuredStep:
    """One rank's measured decode step: ``step_us`` at ``batch``, split into ``components`` when ``traced``.
    ``allreduce`` says whether the measured server ran all-reduces (TP > 1)."""

    step_us: float
    batch: int
    source: str
    traced: bool
    allreduce: bool
    components: Mapping[str, float] = field(default_factory=dict)
    idle_us: float = 0.0
    notes: tuple[str, ...] = ()
    idle_label: str = "GPU idle (launch gaps)"  # a CPU trace's: time outside any operator


@dataclass(frozen=True)
class Part:
    name: str
    budget_us: float | None
    measured_us: float | None
    how: str = ""


@dataclass(frozen=True)
class Versus:
    title: str
    parts: tuple[Part, ...]
    budget_us: float  # the budget's µs set against the measured step (its all-reduce only when the step has one)
    traced: MeasuredStep | None
    served: MeasuredStep | None
    notes: tuple[str, ...]

    def explained_pct(self, step: MeasuredStep | None) -> float | None:
        return None if step is None or step.step_us <= 0 else 100.0 * self.budget_us / step.step_us


def shape_mismatch(budget_spec: ModelSpec, tp: int, measured_spec: ModelSpec, measured_tp: int) -> str | None:
    """Why the measured model's per-rank GEMMs are not the budget's (None: same ops, shapes and counts)."""
    ours = {(s.op, s.k, s.n, s.count, s.weight_bits, s.group_size) for s in rank_gemms(budget_spec, tp)}
    theirs = {(s.op, s.k, s.n, s.count, s.weight_bits, s.group_size) for s in rank_gemms(measured_spec, measured_tp)}
    if ours == theirs:
        return None
    diff = sorted(ours ^ theirs)[:4]
    return (f"{measured_spec.name} at TP={measured_tp} does not run {budget_spec.name}'s TP={tp} per-rank GEMMs "
            f"(op, K, N, count, bits, group differing: {diff})")


def _sum(budget: Budget, components: frozenset[str]) -> float | None:
    rows = [r for r in budget.rows if r.component in components]
    times = [r.total_us for r in rows if r.total_us is not None]
    return sum(times) if times else None


def versus(budget: Budget, traced: MeasuredStep | None, served: MeasuredStep | None) -> Versus:
    """The budget beside the measured step (either view, or both); ``ValueError`` when a batch differs."""
    if traced is None and served is None:
        raise ValueError("no measured step to set the budget beside")
    for step in (traced, served):
        if step is not None and step.batch != budget.batch:
            raise ValueError(f"the measured step ({step.source}) is at batch {step.batch}, the budget at "
                             f"batch {budget.batch}")
    runs_ar = any(s is not None and s.allreduce for s in (traced, served))
    comp = traced.components if traced is not None else {}
    parts: list[Part] = []
    compared = 0.0
    for name, components, trace_name in GEMM_PARTS:
        modelled = _sum(budget, components)
        compared += modelled or 0.0
        gaps = [r.op for r in budget.rows if r.component in components and r.total_us is None]
        parts.append(Part(name, modelled, comp.get(trace_name) if traced else None,
                          f"budget incomplete: no time for {', '.join(gaps)}" if gaps else ""))
    ar_row = next((r for r in budget.rows if r.component == "all-reduce"), None)
    if ar_row is not None:
        if runs_ar and ar_row.total_us is not None:
            compared += ar_row.total_us
            parts.append(Part("all-reduce", ar_row.total_us, comp.get(ALL_REDUCE) if traced else None, ar_row.source))
        else:
            how = ("the measured server runs none (TP=1): left out of both sides" if not runs_ar
                   else ar_row.source)
            parts.append(Part("all-reduce", None, comp.get(ALL_REDUCE) if traced else None, how))
    for name, trace_name in UNMODELLED:
        parts.append(Part(name, None, comp.get(trace_name) if traced else None, "not modelled"))
    if traced is not None:
        parts.append(Part(traced.idle_label, None, traced.idle_us, "not modelled"))
    notes: list[str] = []
    for label, step in (("traced", traced), ("served", served)):
        if step is not None:
            notes += [f"{label}: {step.source}", *step.notes]
    title = f"Budget vs measured decode step: {budget.model}, TP={budget.tp}, batch={budget.batch}"
    return Versus(title, tuple(parts), compared, traced, served, tuple(dict.fromkeys(notes)))


def _us(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _ratio(budget: float | None, measured: float | None) -> str:
    return "-" if budget is None or not measured else f"{budget / measured:.2f}"


def versus_lines(v: Versus) -> list[str]:
    """Markdown: the parts, the steps, the share explained and what is left."""
    rows = [(p.name, _us(p.budget_us), _us(p.measured_us), _ratio(p.budget_us, p.measured_us), p.how)
            for p in v.parts]
    if v.traced is not None:
        rows.append(("step (traced)", _us(v.budget_us), _us(v.traced.step_us), _ratio(v.budget_us, v.traced.step_us),
                     "budget: the rows above with a time"))
    if v.served is not None:
        rows.append(("step (served: engine TPOT)", _us(v.budget_us), _us(v.served.step_us),
                     _ratio(v.budget_us, v.served.step_us), "untraced"))
    lines = [f"## {md_text(v.title)}", ""]
    lines += markdown_table(("part", "budget (us)", "measured (us)", "budget / measured", "how"), rows)
    lines.append("")
    for label, step in (("served", v.served), ("traced", v.traced)):
        pct = v.explained_pct(step)
        if step is not None and pct is not None:
            lines.append(f"The budget explains {pct:.1f} % of the {label} step ({_us(v.budget_us)} of "
                         f"{_us(step.step_us)} us); left: {_us(step.step_us - v.budget_us)} us.")
    if v.traced is not None and v.served is not None and v.served.step_us > 0:
        lines.append(f"Profiler inflation: traced step / served step = {v.traced.step_us / v.served.step_us:.3f}.")
    if v.traced is not None:
        left = [(p.name, p.measured_us) for p in v.parts if p.budget_us is None and p.measured_us]
        gemm_gap = sum((p.measured_us or 0.0) - (p.budget_us or 0.0) for p in v.parts
                       if p.budget_us is not None and p.measured_us is not None)
        lines.append("What is left, from the trace: " + ", ".join(f"{n} {_us(t)} us" for n, t in left)
                     + f"; measured minus modelled in the modelled parts {gemm_gap:+.0f} us.")
    lines += [f"- {md_text(n)}" for n in v.notes]
    return lines


def scaled(step: MeasuredStep, ratio: float, target: str, budget: Budget,
           traced: MeasuredStep | None = None) -> MeasuredStep:
    """``step`` carried to ``target``: GEMM components × ``ratio`` (origin ÷ target bandwidth), the rest as
    measured, plus ``budget``'s all-reduce (the target's, from its named source). A served step has no split of
    its own: its GEMMs are taken from ``traced`` (the same server's trace), an estimate said so."""
    ar_row = next((r for r in budget.rows if r.component == "all-reduce"), None)
    ar_us = ar_row.total_us if ar_row is not None else None
    ar_note = (f"all-reduce {_us(ar_us)} us a step added for {target}: {ar_row.source}" if ar_row and ar_us
               else f"no all-reduce added for {target}: {ar_row.source if ar_row else 'TP=1'}")
    scale_note = (f"GEMMs x{ratio:.3g} to {target} by datasheet bandwidth; attention core, other and GPU idle as "
                  "measured (latency-bound kernels and host time)")
    split = step if step.traced else traced
    if split is None:
        raise ValueError(f"cannot carry the served step ({step.source}) to {target} without a trace of its split")
    gemms = sum(split.components.get(c, 0.0) for c in BANDWIDTH_BOUND)
    if step.traced:
        components = {c: t * ratio if c in BANDWIDTH_BOUND else t for c, t in step.components.items()}
        components[ALL_REDUCE] = ar_us or 0.0
        total = sum(components.values()) + step.idle_us
        return MeasuredStep(total, step.batch, f"{step.source}, carried to {target}", True, bool(ar_us),
                            components, step.idle_us, (*step.notes, scale_note, ar_note), step.idle_label)
    total = step.step_us + (ratio - 1.0) * gemms + (ar_us or 0.0)
    return MeasuredStep(total, step.batch, f"{step.source}, carried to {target}", False, bool(ar_us), {}, 0.0,
                        (*step.notes, scale_note + " (the served step's GEMMs taken from its trace: an estimate)",
                         ar_note))
