"""Decode-step budget arithmetic (pure): Σ over a model's layers of its per-rank GEMMs and all-reduces.

:func:`build_budget` takes a model, TP degree and batch, the measured GEMM times (:class:`Piece`, one per
op × M × implementation) and an all-reduce latency (a fixed figure or measured :class:`AllReducePoint` by message
size) and returns a :class:`Budget` whose rows say where each number came from. What the GEMM and all-reduce
suites do not measure (the attention core reading the KV cache, norms, rope, routing top-k, activation, sampling)
is a row that says "not modelled", never a silent zero.
"""

from __future__ import annotations

import bisect
import dataclasses
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from pytest_moeperf.kernels.devices import DeviceSpec, lookup
from pytest_moeperf.kernels.models import GemmShape, ModelSpec, allreduces_per_step, expected_active_experts, rank_gemms

__all__ = [
    "ALLREDUCE_BACKEND_PREFERENCE",
    "ALLREDUCE_MODE_PREFERENCE",
    "FUSED_MOE_OP",
    "NOT_MODELLED",
    "ROUTED_IMPL_CHOICES",
    "ROUTED_PREFERENCE",
    "AllReducePoint",
    "Budget",
    "BudgetRow",
    "GuardMetric",
    "Piece",
    "allreduce_latency",
    "build_budget",
    "guard_metrics",
    "select_points",
]

#: Per-op implementations preferred for the routed experts (Kimi's are INT4 W4A16: deployed kernels first) and
#: for everything else (bf16 in the checkpoint).
ROUTED_PREFERENCE = ("marlin", "int4", "grouped", "bf16")
DENSE_PREFERENCE = ("bf16",)
#: The op name of a fused MoE measurement (gate_up + activation + down of the routed experts in one call), and
#: the implementation that measures it. When measured at the batch, it replaces the gate_up and down rows.
FUSED_MOE_OP = "routed_moe"
FUSED_MOE_IMPL = "marlin_moe"
#: What ``--routed-impl`` accepts: one implementation, or ``floor`` (the weight-bandwidth floor estimate).
ROUTED_IMPL_CHOICES = (FUSED_MOE_IMPL, *ROUTED_PREFERENCE, "floor")
ALLREDUCE_BACKEND_PREFERENCE = ("nccl",)
#: Preferred all-reduce timing mode: a CUDA-graph replay is what a captured decode step pays.
ALLREDUCE_MODE_PREFERENCE = ("graph", "", "eager")
NOT_MODELLED = "attention core (KV-cache read), norms, rope, top-k, activation, sampling"


@dataclass(frozen=True)
class Piece:
    """A measured GEMM: median µs per call of ``op`` at ``m`` tokens by ``impl``."""

    model: str
    tp: int
    op: str
    m: int
    impl: str
    time_us: float
    source: str = ""
    device: str = ""  # the device it was measured on (context "device"), "" when not said
    k: int = 0  # the per-rank shape (context "k", "n"); 0 when not said
    n: int = 0


@dataclass(frozen=True)
class AllReducePoint:
    """A measured all-reduce: median µs for ``bytes`` bytes on ``world_size`` ranks (0: unknown)."""

    bytes: int
    time_us: float
    backend: str = ""
    world_size: int = 0
    source: str = ""
    mode: str = ""  # "graph" (CUDA graph replay), "eager", or "" when not said
    how: str = "measured"  # or "stated": a figure a topology file carries for its box


@dataclass(frozen=True)
class BudgetRow:
    component: str
    op: str
    count: int
    each_us: float | None
    total_us: float | None
    share_pct: float | None
    source: str


@dataclass(frozen=True)
class Budget:
    model: str
    tp: int
    batch: int
    rows: tuple[BudgetRow, ...]
    total_us: float
    missing: tuple[str, ...]  # ops with no time at all (the total leaves them out)
    #: why the step is shown without its all-reduces ("" when they are in it, or TP=1 has none)
    without_allreduce: str = ""

    @property
    def allreduce_share_pct(self) -> float | None:
        row = next((r for r in self.rows if r.component == "all-reduce"), None)
        return row.share_pct if row else None

    @property
    def allreduce_step_us(self) -> float:
        return sum(r.total_us or 0.0 for r in self.rows if r.component == "all-reduce")

    @property
    def gemm_step_us(self) -> float:
        return self.total_us - self.allreduce_step_us


@dataclass(frozen=True)
class GuardMetric:
    """A number a budget guard records: ``gated`` ones are judged against their baseline, the others are
    derived figures shown for information (a ratio of two gated terms moves when either term does)."""

    name: str
    value: float
    unit: str
    better: str
    gated: bool


def guard_metrics(budget: Budget) -> list[GuardMetric]:
    """What a budget guard judges: the per-step µs of the GEMM term, measured now, lower-is-better. The all-reduce
    term is shown, never gated: it is computed from the stored all-reduce baselines, which the all-reduce suite
    judges; gated against its own stored runs it judged only whether those baselines had changed since the budget
    was recorded (an update of the all-reduce suite read +21 % REGRESSED in the next judged run, the machine and the
    code unchanged). The all-reduce share is derived from both: informational too (gated lower-is-better it would
    read a GEMM speed-up as a regression)."""
    metrics = [
        GuardMetric("gemm_step_us", budget.gemm_step_us, "us", "lower", True),
        GuardMetric("allreduce_step_us", budget.allreduce_step_us, "us", "lower", False),
    ]
    if budget.allreduce_share_pct is not None:
        metrics.append(GuardMetric("allreduce_share_pct", budget.allreduce_share_pct, "%", "lower", False))
    return metrics


def allreduce_latency(points: Sequence[AllReducePoint], nbytes: int) -> tuple[float, str]:
    """Latency for ``nbytes`` from measured points: exact size if present, else log-log interpolation between
    the neighbouring sizes, else the nearest size (clamped, said so in the source)."""
    if not points:
        raise ValueError("no all-reduce points")
    pts = sorted(points, key=lambda p: p.bytes)
    sizes = [p.bytes for p in pts]
    i = bisect.bisect_left(sizes, nbytes)
    if i < len(pts) and sizes[i] == nbytes:
        p = pts[i]
        return p.time_us, f"{p.how} {_label(p)} {p.bytes} B{_where(p.source)}"
    if 0 < i < len(pts):
        lo, hi = pts[i - 1], pts[i]
        f = (math.log(nbytes) - math.log(lo.bytes)) / (math.log(hi.bytes) - math.log(lo.bytes))
        t = math.exp(math.log(lo.time_us) + f * (math.log(hi.time_us) - math.log(lo.time_us)))
        return t, f"interpolated {lo.how} {_label(lo)} {lo.bytes}-{hi.bytes} B{_where(lo.source)}"
    p = pts[0] if i == 0 else pts[-1]
    return p.time_us, f"nearest {p.how} {_label(p)} size {p.bytes} B (clamped){_where(p.source)}"


def _label(p: AllReducePoint) -> str:
    parts = [p.backend or "all-reduce", p.mode, f"{p.world_size} ranks" if p.world_size else ""]
    return " ".join(part for part in parts if part)


def _where(source: str) -> str:
    return f" [{source}]" if source else ""


def select_points(points: Sequence[AllReducePoint], tp: int,
                  backends: Sequence[str] | None = None) -> list[AllReducePoint]:
    """One consistent series of all-reduce points for a TP degree: ranks == ``tp`` if measured (else the
    largest rank count measured, which the row's source then names), backend by
    :data:`ALLREDUCE_BACKEND_PREFERENCE` (else alphabetical) among ``backends`` (default: any), mode by
    :data:`ALLREDUCE_MODE_PREFERENCE`."""
    if backends is not None:
        points = [p for p in points if p.backend in backends]
    if not points:
        return []
    worlds = {p.world_size for p in points}
    world = tp if tp in worlds else max(worlds)
    usable = [p for p in points if p.world_size == world]
    names = sorted({p.backend for p in usable})
    backend = next((b for b in ALLREDUCE_BACKEND_PREFERENCE if b in names), names[0])
    usable = [p for p in usable if p.backend == backend]
    modes = {p.mode for p in usable}
    mode = next((m for m in ALLREDUCE_MODE_PREFERENCE if m in modes), sorted(modes)[0])
    chosen = [p for p in usable if p.mode == mode]
    if world not in (0, tp):
        note = f"{world} ranks measured, TP={tp}"
        chosen = [dataclasses.replace(p, source=f"{p.source}; {note}" if p.source else note) for p in chosen]
    return chosen


def _pick(pieces: Iterable[Piece], op: str, m: int, preference: Sequence[str]) -> Piece | None:
    matching = {p.impl: p for p in pieces if p.op == op and p.m == m}
    for impl in preference:
        if impl in matching:
            return matching[impl]
    return None


def _on_device(piece: Piece, target: DeviceSpec | None) -> tuple[float, str]:
    """A piece's time on ``target``: as measured when it was measured there (or either bandwidth is unknown);
    else scaled by the ratio of datasheet bandwidths (decode GEMMs are weight-bandwidth bound), said so."""
    measured = f"measured {piece.impl}" + (f" on {piece.device}" if piece.device else "")
    if target is None or not piece.device:
        return piece.time_us, measured
    origin = lookup(piece.device)
    if origin.mem_bw_bytes_s is None or target.mem_bw_bytes_s is None or origin.mem_bw_bytes_s == target.mem_bw_bytes_s:
        return piece.time_us, measured
    ratio = origin.mem_bw_bytes_s / target.mem_bw_bytes_s
    return piece.time_us * ratio, f"{measured}, scaled x{ratio:.3g} to {target.name} by datasheet bandwidth"


def _estimate(shape: GemmShape, spec: ModelSpec, batch: int, device: DeviceSpec | None) -> tuple[float, str] | None:
    if device is None or device.mem_bw_bytes_s is None:
        return None
    matrices = expected_active_experts(spec, batch) if shape.component == "routed_experts" else 1.0
    t = matrices * shape.weight_bytes() / device.mem_bw_bytes_s * 1e6
    return t, f"estimate, not measured: weight bytes / datasheet bandwidth of {device.name}"


Raw = tuple[str, str, int, "float | None", str]


def _gemm_rows(spec: ModelSpec, tp: int, batch: int, pieces: Sequence[Piece], device: DeviceSpec | None,
               routed_impl: str | None) -> tuple[list[Raw], list[str]]:
    raw: list[Raw] = []
    missing: list[str] = []
    fused = None
    if routed_impl in (None, FUSED_MOE_IMPL):
        fused = _pick(pieces, FUSED_MOE_OP, batch, (FUSED_MOE_IMPL,))
    for shape in rank_gemms(spec, tp):
        preference: Sequence[str] = DENSE_PREFERENCE
        if shape.component == "routed_experts":
            if fused is not None:
                if shape.op == "gate_up":  # one row for the fused call; "down" is inside it
                    each, how = _on_device(fused, device)
                    raw.append((shape.component, f"{FUSED_MOE_OP} (gate_up + act + down)", shape.count, each,
                                how + _where(fused.source)))
                continue
            preference = ROUTED_PREFERENCE if routed_impl is None else (
                () if routed_impl in ("floor", FUSED_MOE_IMPL) else (routed_impl,))
        piece = _pick(pieces, shape.op, batch, preference)
        if piece is not None:
            each, how = _on_device(piece, device)
            raw.append((shape.component, shape.op, shape.count, each, how + _where(piece.source)))
            continue
        est = _estimate(shape, spec, batch, device)
        if est is not None:
            raw.append((shape.component, shape.op, shape.count, est[0], est[1]))
        else:
            raw.append((shape.component, shape.op, shape.count, None, "not measured"))
            missing.append(shape.op)
    return raw, missing


def _same_shape(spec: ModelSpec, tp: int, own: Sequence[Piece], pieces: Sequence[Piece]) -> list[Piece]:
    """Pieces of other models (or TP degrees) measured at one of ``spec``'s per-rank shapes at ``tp`` (same op,
    K and N), for ops ``own`` lacks, relabelled as ``spec``'s: a model sized so its per-rank shapes are
    another's (``kimi_rank_shaped_spec``) reuses that model's measurements. Routed-expert pieces also need the
    same expert count and top-k (the piece covers every expert a batch touches); a fused MoE piece (the whole
    routed block, K = hidden, N = expert intermediate per rank) moves when hidden size, per-rank expert
    intermediate, expert count and top-k all match."""
    from pytest_moeperf.kernels.models import MODELS

    have = {(p.op, p.m, p.impl) for p in own}
    out = []
    routed = (spec.n_routed_experts, spec.experts_per_token)
    shapes = [(s.component, s.op, s.k, s.n) for s in rank_gemms(spec, tp)]
    if spec.n_routed_experts:  # the fused routed block: K = hidden, N = expert intermediate per rank
        shapes.append(("routed_experts", FUSED_MOE_OP, spec.hidden_size, spec.moe_intermediate // tp))
    for component, op, k, n in shapes:
        for p in pieces:
            if (p.op, p.k, p.n) != (op, k, n) or (p.op, p.m, p.impl) in have or p.k == 0:
                continue
            if component == "routed_experts":
                other = MODELS.get(p.model)
                if other is None or (other.n_routed_experts, other.experts_per_token) != routed:
                    continue
            note = f"same per-rank shape as {p.model} TP{p.tp} {p.op} ({p.k}x{p.n})"
            out.append(dataclasses.replace(p, model=spec.name, tp=tp,
                                           source=f"{p.source}; {note}" if p.source else note))
            have.add((p.op, p.m, p.impl))
    return out


def build_budget(
    spec: ModelSpec,
    tp: int,
    batch: int,
    pieces: Sequence[Piece],
    allreduce: float | Sequence[AllReducePoint] | None,
    *,
    device: DeviceSpec | None = None,
    allreduce_source: str = "",
    routed_impl: str | None = None,
    without_allreduce: str = "",
) -> Budget:
    """The decode-step budget of ``spec`` at ``tp`` and ``batch``.

    GEMM rows: one per per-rank op (:func:`~pytest_moeperf.kernels.models.rank_gemms`), count = layers having it,
    time each = the measured piece at ``m == batch``. Routed experts: a fused MoE piece (:data:`FUSED_MOE_OP`)
    when measured replaces gate_up and down with one row; else per op by :data:`ROUTED_PREFERENCE` (the piece
    already covers every expert the batch touches); others by :data:`DENSE_PREFERENCE`. Without a piece, and with
    a ``device`` whose bandwidth is known, a roofline floor estimate labelled as such; otherwise the row has no
    time and the op is listed in ``Budget.missing``. The all-reduce row uses ``allreduce`` (µs, or measured
    points by size). Shares are of the total of rows with a time. ``allreduce=None`` with ``without_allreduce``
    (why: :func:`~pytest_moeperf.kernels.budget.sources.choose_allreduce`) shows the step without its all-reduces,
    on purpose; without a reason the all-reduce is missing like any op with no time.

    ``routed_impl`` picks the routed experts' implementation instead of the preference order; ``"floor"`` takes the
    bandwidth-floor estimate (a stand-in for a deployed kernel that was not measured).
    """
    if routed_impl is not None and routed_impl not in ROUTED_IMPL_CHOICES:
        raise ValueError(f"routed_impl must be one of {', '.join(ROUTED_IMPL_CHOICES)}, got {routed_impl!r}")
    own = [p for p in pieces if p.model == spec.name and p.tp == tp]
    raw, missing = _gemm_rows(spec, tp, batch, own + _same_shape(spec, tp, own, pieces), device, routed_impl)
    ar = allreduces_per_step(spec, tp, batch)
    if ar.count:
        if allreduce is None and without_allreduce:
            raw.append(("all-reduce", f"{ar.bytes_each} B", ar.count, None, f"left out: {without_allreduce}"))
        elif allreduce is None:
            raw.append(("all-reduce", f"{ar.bytes_each} B", ar.count, None, "no all-reduce latency given"))
            missing.append("all-reduce")
        elif isinstance(allreduce, (int, float)):
            raw.append(("all-reduce", f"{ar.bytes_each} B", ar.count, float(allreduce),
                        allreduce_source or "given"))
        else:
            t, src = allreduce_latency(allreduce, ar.bytes_each)
            raw.append(("all-reduce", f"{ar.bytes_each} B", ar.count, t, src))
    total = sum(count * each for _, _, count, each, _ in raw if each is not None)
    rows = [
        BudgetRow(comp, op, count, each, None if each is None else count * each,
                  None if each is None or total <= 0 else 100.0 * count * each / total, src)
        for comp, op, count, each, src in raw
    ]
    rows.append(BudgetRow("not modelled", NOT_MODELLED, 0, None, None, None, "not measured by these suites"))
    return Budget(spec.name, tp, batch, tuple(rows), total, tuple(missing),
                  without_allreduce if ar.count and allreduce is None else "")

