"""Decode-step time budget: Σ over a model's layers of its per-rank GEMMs and all-reduces, and each one's share.

Pure core: :func:`build_budget` takes a model, TP degree and batch, the measured GEMM times (:class:`Piece`, one
per op × M × implementation) and an all-reduce latency (a fixed figure or measured points by message size) and
returns a :class:`Budget` whose rows say where each number came from. Loaders turn a run's JSON report
(:func:`pieces_from_report`) or a fingerprint's baselines (:func:`pieces_from_baselines`) into pieces.
What the GEMM and all-reduce suites do not measure (the attention core reading the KV cache, norms, rope,
routing top-k, activation, sampling) is a row that says "not modelled", never a silent zero.

Surfaces: ``moeperf budget`` (:func:`main_budget`) and a report section when a session measured both GEMMs and
all-reduces (:func:`pytest_moeperf_report_sections`).
"""

from __future__ import annotations

import argparse
import bisect
import json
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


from pytest_moeperf import stats
from pytest_moeperf.kernels.devices import DeviceSpec, lookup
from pytest_moeperf.kernels.models import (
    GemmShape,
    ModelSpec,
    allreduces_per_step,
    expected_active_experts,
    get_model,
    model_names,
    rank_gemms,
)
from pytest_moeperf.records import Measurement, Section

__all__ = [
    "AllReducePoint",
    "Budget",
    "BudgetRow",
    "Piece",
    "allreduce_latency",
    "build_budget",
    "budget_from_baselines",
    "budget_from_report",
    "budget_lines",
    "budget_section",
    "main_budget",
    "pieces_from_baselines",
    "pieces_from_measurements",
    "pieces_from_report",
    "points_from_records",
    "select_points",
    "budget_sections_from",
]

#: Implementations preferred for the routed experts (Kimi's are INT4 W4A16: deployed kernels first) and for
#: everything else (bf16 in the checkpoint).
ROUTED_PREFERENCE = ("marlin_moe", "marlin", "int4", "grouped", "bf16")
#: What ``--routed-impl`` accepts: one implementation, or ``floor`` (the weight-bandwidth floor estimate).
ROUTED_IMPL_CHOICES = (*ROUTED_PREFERENCE, "floor")
DENSE_PREFERENCE = ("bf16",)
ALLREDUCE_BACKEND_PREFERENCE = ("nccl",)
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


@dataclass(frozen=True)
class AllReducePoint:
    """A measured all-reduce: median µs for ``bytes`` bytes on ``world_size`` ranks (0: unknown)."""

    bytes: int
    time_us: float
    backend: str = ""
    world_size: int = 0
    source: str = ""
    mode: str = ""  # "graph" (CUDA graph replay), "eager", or "" when not said


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

    @property
    def allreduce_share_pct(self) -> float | None:
        row = next((r for r in self.rows if r.component == "all-reduce"), None)
        return row.share_pct if row else None


# ------------------------------------------------------------------------------------------------ pure core


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
        return p.time_us, f"measured {_label(p)} {p.bytes} B{_where(p.source)}"
    if 0 < i < len(pts):
        lo, hi = pts[i - 1], pts[i]
        f = (math.log(nbytes) - math.log(lo.bytes)) / (math.log(hi.bytes) - math.log(lo.bytes))
        t = math.exp(math.log(lo.time_us) + f * (math.log(hi.time_us) - math.log(lo.time_us)))
        return t, f"interpolated {_label(lo)} {lo.bytes}-{hi.bytes} B{_where(lo.source)}"
    p = pts[0] if i == 0 else pts[-1]
    return p.time_us, f"nearest measured {_label(p)} size {p.bytes} B (clamped){_where(p.source)}"


def _label(p: AllReducePoint) -> str:
    parts = [p.backend or "all-reduce", p.mode, f"{p.world_size} ranks" if p.world_size else ""]
    return " ".join(part for part in parts if part)


def _where(source: str) -> str:
    return f" [{source}]" if source else ""


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
) -> Budget:
    """The decode-step budget of ``spec`` at ``tp`` and ``batch``.

    GEMM rows: one per per-rank op (:func:`~pytest_moeperf.kernels.models.rank_gemms`), count = layers having it, time
    each = the measured piece at ``m == batch`` (routed experts: the piece already covers every expert the batch
    touches; implementation by :data:`ROUTED_PREFERENCE`, others :data:`DENSE_PREFERENCE`). Without a piece, and
    with a ``device`` whose bandwidth is known, a roofline floor estimate labelled as such; otherwise the row has
    no time and the op is listed in ``Budget.missing``. The all-reduce row uses ``allreduce`` (µs, or measured
    points by size). Shares are of the total of rows with a time.

    ``routed_impl`` picks the routed experts' implementation instead of the preference order; ``"floor"`` takes the
    bandwidth-floor estimate (e.g. to stand in for a deployed kernel, such as Marlin, that was not measured).
    """
    if routed_impl is not None and routed_impl not in ROUTED_IMPL_CHOICES:
        raise ValueError(f"routed_impl must be one of {', '.join(ROUTED_IMPL_CHOICES)}, got {routed_impl!r}")
    pieces = [p for p in pieces if p.model == spec.name and p.tp == tp]
    raw: list[tuple[str, str, int, float | None, str]] = []
    missing: list[str] = []
    for shape in rank_gemms(spec, tp):
        preference: Sequence[str] = DENSE_PREFERENCE
        if shape.component == "routed_experts":
            preference = ROUTED_PREFERENCE if routed_impl is None else (
                () if routed_impl == "floor" else (routed_impl,))
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
    ar = allreduces_per_step(spec, tp, batch)
    if ar.count:
        if allreduce is None:
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
    return Budget(spec.name, tp, batch, tuple(rows), total, tuple(missing))


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def budget_table(budget: Budget) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    columns: tuple[str, ...] = ("component", "op", "count/step", "each (us)", "total (us)", "share %", "source")
    rows: list[tuple[str, ...]] = [(r.component, r.op, str(r.count), _num(r.each_us), _num(r.total_us),
             "-" if r.share_pct is None else f"{r.share_pct:.1f}", r.source) for r in budget.rows]
    return columns, rows


def _by_component(budget: Budget) -> list[tuple[str, float, float]]:
    totals: dict[str, float] = {}
    for r in budget.rows:
        if r.total_us is not None:
            totals[r.component] = totals.get(r.component, 0.0) + r.total_us
    return [(c, t, 100.0 * t / budget.total_us if budget.total_us else 0.0) for c, t in totals.items()]


def budget_lines(budget: Budget) -> list[str]:
    """A Markdown rendering (title, op table, per-component summary, caveats); returns lines, prints nothing."""
    columns, rows = budget_table(budget)
    lines = [f"## Decode-step budget: {budget.model}, TP={budget.tp}, batch={budget.batch}", ""]
    lines.append("| " + " | ".join(columns) + " |")
    lines.append("|" + "|".join("---" for _ in columns) + "|")
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    lines += ["", "| component | total (us) | share % |", "|---|---|---|"]
    lines += [f"| {c} | {t:.4g} | {s:.1f} |" for c, t, s in _by_component(budget)]
    lines += ["", f"Modelled step time: {budget.total_us:.4g} us per rank"
              + (f" (all-reduce share {budget.allreduce_share_pct:.1f} %)" if budget.allreduce_share_pct else "")]
    if budget.missing:
        lines.append(f"Incomplete: no time for {', '.join(budget.missing)} (left out of the total).")
    lines.append(f"Not modelled: {NOT_MODELLED}; the real step is longer than this sum.")
    return lines


# ------------------------------------------------------------------------------------------------- loaders


def _median_time(name: str, unit: str) -> bool:
    return name == "time" and unit == "us"


def _piece(context: Mapping[str, Any], time_us: float, source: str) -> Piece | None:
    try:
        return Piece(str(context["model"]), int(context["tp"]), str(context["op"]), int(context["m"]),
                     str(context["impl"]), float(time_us), source, str(context.get("device") or ""))
    except (KeyError, TypeError, ValueError):
        return None


_AR_BYTES_KEYS = ("bytes", "message_bytes", "nbytes", "size_bytes", "size")
_AR_WORLD_KEYS = ("world", "world_size", "ranks", "nranks")
_AR_TIME_NAMES = ("latency_graph", "latency_eager", "latency", "time", "latency_us", "time_us")
#: Preferred all-reduce timing mode: a CUDA-graph replay is what a captured decode step pays.
ALLREDUCE_MODE_PREFERENCE = ("graph", "", "eager")


def _is_allreduce(test_id: str, context: Mapping[str, Any]) -> bool:
    op = str(context.get("op", context.get("collective", ""))).lower().replace("-", "_")
    return op in ("allreduce", "all_reduce") or "allreduce" in test_id.lower().replace("_", "")


def _ar_point(test_id: str, name: str, unit: str, context: Mapping[str, Any], time_us: float,
              source: str) -> AllReducePoint | None:
    if unit != "us" or name not in _AR_TIME_NAMES or not _is_allreduce(test_id, context):
        return None
    nbytes = next((context[k] for k in _AR_BYTES_KEYS if isinstance(context.get(k), int)), None)
    if nbytes is None or nbytes <= 0:
        return None
    world = next((int(context[k]) for k in _AR_WORLD_KEYS if isinstance(context.get(k), int)), 0)
    mode = str(context.get("mode") or (name.split("_", 1)[1] if name.startswith("latency_") else ""))
    return AllReducePoint(int(nbytes), float(time_us), str(context.get("backend", "")), world, source, mode)


def points_from_records(records: Iterable[tuple[str, str, str, Mapping[str, Any], float]],
                        source: str) -> tuple[list[Piece], list[AllReducePoint]]:
    """GEMM pieces and all-reduce points from ``(test_id, metric, unit, context, median)`` tuples."""
    pieces: list[Piece] = []
    points: list[AllReducePoint] = []
    for test_id, name, unit, context, median in records:
        if _median_time(name, unit) and "impl" in context and not _is_allreduce(test_id, context):
            piece = _piece(context, median, source)
            if piece is not None:
                pieces.append(piece)
                continue
        point = _ar_point(test_id, name, unit, context, median, source)
        if point is not None:
            points.append(point)
    return pieces, points


def pieces_from_measurements(measurements: Iterable[Measurement],
                             source: str = "this run") -> tuple[list[Piece], list[AllReducePoint]]:
    return points_from_records(
        ((m.test_id, m.name, m.unit, m.context, stats.median(m.samples)) for m in measurements), source)


def pieces_from_report(path: str | Path) -> tuple[list[Piece], list[AllReducePoint]]:
    """From a run's JSON report (``--moeperf-report``, pytest-benchmark schema with moeperf contexts)."""
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    records = []
    for b in data.get("benchmarks", []):
        info = b.get("extra_info", {})
        test_id = str(b.get("fullname", "")).rpartition("::")[0]
        context = b.get("params") or {}
        records.append((test_id, str(info.get("metric", "")), str(info.get("unit", "")), context,
                        float(b["stats"]["median"])))
    return points_from_records(records, f"report {Path(path).name}")


def pieces_from_baselines(root: str | Path, slug: str) -> tuple[list[Piece], list[AllReducePoint]]:
    """From ``<root>/<slug>/*.json`` baseline files (their stored medians)."""
    directory = Path(root) / slug
    if not directory.is_dir():
        raise FileNotFoundError(f"no baselines for fingerprint {slug!r} under {root}")
    records = []
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        for entry in data.get("metrics", {}).values():
            records.append((str(entry.get("test", "")), str(entry.get("name", "")), str(entry.get("unit", "")),
                            entry.get("context", {}), float(entry["summary"]["median"])))
    return points_from_records(records, f"baselines {slug}")


def select_points(points: Sequence[AllReducePoint], tp: int) -> list[AllReducePoint]:
    """One consistent series of all-reduce points for a TP degree: ranks == ``tp`` if measured (else the
    largest rank count measured, which the row's source then names), backend by
    :data:`ALLREDUCE_BACKEND_PREFERENCE` (else alphabetical), mode by :data:`ALLREDUCE_MODE_PREFERENCE`."""
    if not points:
        return []
    worlds = {p.world_size for p in points}
    world = tp if tp in worlds else max(worlds)
    usable = [p for p in points if p.world_size == world]
    backends = sorted({p.backend for p in usable})
    backend = next((b for b in ALLREDUCE_BACKEND_PREFERENCE if b in backends), backends[0])
    usable = [p for p in usable if p.backend == backend]
    modes = {p.mode for p in usable}
    mode = next((m for m in ALLREDUCE_MODE_PREFERENCE if m in modes), sorted(modes)[0])
    chosen = [p for p in usable if p.mode == mode]
    if world not in (0, tp):
        note = f"{world} ranks measured, TP={tp}"
        chosen = [AllReducePoint(p.bytes, p.time_us, p.backend, p.world_size,
                                 f"{p.source}; {note}" if p.source else note, p.mode) for p in chosen]
    return chosen


def budget_from_report(path: str | Path, spec: ModelSpec, tp: int, batch: int, *,
                       allreduce_us: float | None = None, device: DeviceSpec | None = None,
                       routed_impl: str | None = None) -> Budget:
    pieces, points = pieces_from_report(path)
    return _assemble(spec, tp, batch, pieces, points, allreduce_us, device, routed_impl)


def budget_from_baselines(root: str | Path, slug: str, spec: ModelSpec, tp: int, batch: int, *,
                          allreduce_us: float | None = None, device: DeviceSpec | None = None,
                          routed_impl: str | None = None) -> Budget:
    pieces, points = pieces_from_baselines(root, slug)
    return _assemble(spec, tp, batch, pieces, points, allreduce_us, device, routed_impl)


def _assemble(spec: ModelSpec, tp: int, batch: int, pieces: Sequence[Piece], points: Sequence[AllReducePoint],
              allreduce_us: float | None, device: DeviceSpec | None, routed_impl: str | None = None) -> Budget:
    if allreduce_us is not None:
        return build_budget(spec, tp, batch, pieces, allreduce_us, device=device,
                            allreduce_source="given (--allreduce-us)", routed_impl=routed_impl)
    world = select_points(points, tp)
    return build_budget(spec, tp, batch, pieces, world or None, device=device, routed_impl=routed_impl)


# ----------------------------------------------------------------------------------------- report section


def budget_section(budget: Budget) -> Section:
    columns, rows = budget_table(budget)
    note = (f"step {budget.total_us:.4g} us per rank; not modelled: {NOT_MODELLED}"
            + (f"; no time for {', '.join(budget.missing)}" if budget.missing else ""))
    return Section(f"Decode-step budget: {budget.model} TP={budget.tp} batch={budget.batch}", columns,
                   tuple(rows), note)


def budget_sections_from(measurements: list[Measurement]) -> list[Section]:
    """A budget table per (model, tp, batch) this session measured GEMMs for, when it also measured
    all-reduces (batch sizes: the GEMM ``m`` values; all-reduce latency interpolated by message size)."""
    pieces, points = pieces_from_measurements(measurements)
    if not pieces or not points:
        return []
    sections = []
    for model, tp in sorted({(p.model, p.tp) for p in pieces}):
        try:
            spec = get_model(model)
        except KeyError:
            continue
        world = select_points(points, tp)
        for batch in sorted({p.m for p in pieces if p.model == model and p.tp == tp}):
            budget = build_budget(spec, tp, batch, pieces, world)
            if not budget.missing:
                sections.append(budget_section(budget))
    return sections


# --------------------------------------------------------------------------------------------------- CLI


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="moeperf budget",
        description="Decode-step time budget (GEMMs + all-reduces per rank) from measured numbers.",
    )
    p.add_argument("--model", default="kimi-k2.5",
                   help=f"registered model ({', '.join(model_names())}) or a config.json path (default: kimi-k2.5)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel degree (default: the topology's GPU "
                   "count, else 8)")
    p.add_argument("--batch", type=int, default=1, help="decode batch (tokens per step; default: 1)")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--from-report", metavar="PATH", type=Path, help="a run's JSON report (--moeperf-report)")
    src.add_argument("--baselines", metavar="DIR", type=Path, help="baselines root (with --fingerprint)")
    p.add_argument("--fingerprint", metavar="SLUG", help="fingerprint slug under --baselines")
    p.add_argument("--allreduce-us", metavar="US", type=float, help="all-reduce latency per call, overriding "
                   "measured points")
    p.add_argument("--topology", metavar="FILE", help="topology file or bundled name: the target GPU. Pieces "
                   "measured on another GPU are scaled by the datasheet bandwidth ratio, ops with no measurement "
                   "get a bandwidth floor estimate (both labelled); also the default --tp")
    p.add_argument("--routed-impl", choices=ROUTED_IMPL_CHOICES, default=None,
                   help="routed experts' implementation (default: the first measured of "
                   f"{', '.join(ROUTED_PREFERENCE)}); 'floor' = weight bytes / datasheet bandwidth, a stand-in for "
                   "a deployed INT4 kernel (Marlin) that was not measured")
    return p


def main_budget(argv: Sequence[str] | None = None, *, out: Callable[[str], Any] = print) -> int:
    """``moeperf budget``: print the budget table; 0 on success, 2 on bad arguments or unreadable inputs."""
    parser = _parser()
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.baselines is not None and not args.fingerprint:
        parser.error("--baselines needs --fingerprint SLUG")
    try:
        spec = get_model(args.model)
        device: DeviceSpec | None = None
        tp = args.tp
        if args.topology:
            from pytest_moeperf.topology import load_topology

            topo = load_topology(args.topology)
            if topo.gpus:
                device = lookup(topo.gpus[0].name)
            tp = tp or topo.gpu_count or None
        tp = tp or 8
        pieces: list[Piece] = []
        points: list[AllReducePoint] = []
        if args.from_report is not None:
            pieces, points = pieces_from_report(args.from_report)
        elif args.baselines is not None:
            pieces, points = pieces_from_baselines(args.baselines, args.fingerprint)
        budget = _assemble(spec, tp, args.batch, pieces, points, args.allreduce_us, device, args.routed_impl)
    except (OSError, ValueError, KeyError) as exc:
        print(f"moeperf budget: {exc}", file=sys.stderr)
        return 2
    for line in budget_lines(budget):
        out(line)
    return 0
