"""What a budget is built from: GEMM pieces and all-reduce points, read from declared context keys.

The suites declare what a measurement is through its context (``perf.context``), and only that is read here:

* a GEMM piece: metric :data:`GEMM_METRIC` (µs) with the context keys :data:`GEMM_KEYS` (``model, tp, op, m,
  impl``; ``device`` when known), as ``suites/gemm`` sets them;
* an all-reduce point: context ``op == "allreduce"`` with :data:`ALLREDUCE_KEYS` (``bytes, world, backend,
  mode``) and the metric ``latency_<mode>`` (µs), as ``suites/allreduce`` sets them.

Sources: this session's measurements, a run's JSON report (through
:func:`pytest_moeperf.reports.document.benchmark_metrics`, the report format's reader) and stored baselines (only
through :mod:`pytest_moeperf.store.baselines`: the store and its schema-checked reader).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from pytest_moeperf.judging import stats
from pytest_moeperf.kernels.budget.calc import AllReducePoint, Piece
from pytest_moeperf.kernels.budget.sources import slug_family
from pytest_moeperf.ledger import Measurement
from pytest_moeperf.reports.document import benchmark_metrics, report_fingerprint
from pytest_moeperf.store.baselines import BaselineStore, read_file

__all__ = [
    "ALLREDUCE_KEYS",
    "ALLREDUCE_OP",
    "ALLREDUCE_SUITE",
    "GEMM_KEYS",
    "GEMM_METRIC",
    "Inputs",
    "allreduce_points_from_store",
    "family_allreduce",
    "inputs_from_baselines",
    "inputs_from_measurements",
    "inputs_from_records",
    "inputs_from_report",
    "report_slug",
]

GEMM_METRIC = "time"
GEMM_KEYS = ("model", "tp", "op", "m", "impl")
ALLREDUCE_OP = "allreduce"
ALLREDUCE_KEYS = ("bytes", "world", "backend", "mode")
#: The baseline file (test-file stem) the all-reduce suite writes, which a budget guard depends on.
ALLREDUCE_SUITE = "test_allreduce"

Inputs = tuple[list[Piece], list[AllReducePoint]]
#: ``(metric name, unit, context, median)``
Record = tuple[str, str, Mapping[str, Any], float]


def _piece(context: Mapping[str, Any], time_us: float, source: str) -> Piece | None:
    if any(context.get(k) is None for k in GEMM_KEYS):
        return None
    try:
        return Piece(str(context["model"]), int(context["tp"]), str(context["op"]), int(context["m"]),
                     str(context["impl"]), float(time_us), source, str(context.get("device") or ""),
                     int(context.get("k") or 0), int(context.get("n") or 0))
    except (TypeError, ValueError):
        return None


def _point(name: str, context: Mapping[str, Any], time_us: float, source: str) -> AllReducePoint | None:
    if any(context.get(k) is None for k in ALLREDUCE_KEYS) or name != f"latency_{context['mode']}":
        return None
    try:
        return AllReducePoint(int(context["bytes"]), float(time_us), str(context["backend"]), int(context["world"]),
                              source, str(context["mode"]))
    except (TypeError, ValueError):
        return None


def inputs_from_records(records: Iterable[Record], source: str) -> Inputs:
    """GEMM pieces and all-reduce points from ``(metric, unit, context, median)`` records; others are ignored."""
    pieces: list[Piece] = []
    points: list[AllReducePoint] = []
    for name, unit, context, median in records:
        if unit != "us":
            continue
        if context.get("op") == ALLREDUCE_OP:
            point = _point(name, context, median, source)
            if point is not None:
                points.append(point)
        elif name == GEMM_METRIC:
            piece = _piece(context, median, source)
            if piece is not None:
                pieces.append(piece)
    return pieces, points


def inputs_from_measurements(measurements: Iterable[Measurement], source: str = "this run") -> Inputs:
    return inputs_from_records(((m.name, m.unit, m.context, stats.median(m.samples)) for m in measurements), source)


def inputs_from_report(path: str | Path) -> Inputs:
    """From a run's JSON report (``--moeperf-report``)."""
    document = json.loads(Path(path).read_text(encoding="utf-8"))
    records = [(metric, unit, context, median) for _key, metric, unit, context, median in benchmark_metrics(document)]
    return inputs_from_records(records, f"report {Path(path).name}")


def _store_records(store: BaselineStore, suites: Iterable[str]) -> list[Record]:
    records: list[Record] = []
    for suite in suites:
        found = store.file(suite)
        if found is not None:
            records += [(e.name, e.unit, e.context, e.summary.median) for e in found.entries.values()]
    return records


def inputs_from_baselines(root: str | Path, slug: str) -> Inputs:
    """From every baseline file of fingerprint ``slug`` under ``root`` (schema-checked by the store's reader);
    ``FileNotFoundError`` when that fingerprint has none, :class:`~pytest_moeperf.store.baselines.BaselineError` for a
    file that cannot be used."""
    store = BaselineStore(Path(root), slug)
    if not store.directory.is_dir():
        raise FileNotFoundError(f"no baselines for fingerprint {slug!r} under {root}")
    records: list[Record] = []
    for path in sorted(store.directory.glob("*.json")):
        records += [(e.name, e.unit, e.context, e.summary.median) for e in read_file(path).entries.values()]
    return inputs_from_records(records, f"baselines {slug}")


def allreduce_points_from_store(store: BaselineStore) -> list[AllReducePoint]:
    """The all-reduce points stored by the all-reduce suite (:data:`ALLREDUCE_SUITE`) for ``store``'s fingerprint."""
    return inputs_from_records(_store_records(store, (ALLREDUCE_SUITE,)), f"baselines {store.slug}")[1]


def report_slug(path: str | Path) -> str | None:
    """The fingerprint slug of the box a run's JSON report measured on (None when it does not say)."""
    return report_fingerprint(json.loads(Path(path).read_text(encoding="utf-8")))


def family_allreduce(root: str | Path, slug: str, *, skip: str | None = None) -> list[tuple[str, list[AllReducePoint]]]:
    """The all-reduce points of every fingerprint under ``root`` of ``slug``'s family (:func:`slug_family`: the same
    GPU and interconnect, another GPU count), ``slug`` itself first, ``skip`` left out; only those holding points."""
    family = slug_family(slug)
    names = sorted((p.name for p in Path(root).iterdir() if p.is_dir() and slug_family(p.name) == family),
                   key=lambda name: (name != slug, name)) if Path(root).is_dir() else []
    found = []
    for name in names:
        if name != skip:
            points = allreduce_points_from_store(BaselineStore(Path(root), name))
            if points:
                found.append((name, points))
    return found
