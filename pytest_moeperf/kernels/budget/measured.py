"""Measured decode steps to set beside a budget, read from the files the project writes (I/O; the comparison is
:mod:`~pytest_moeperf.kernels.budget.versus`):

* ``moeperf attribute --json`` output (a list of attribution records, read by
  :meth:`~pytest_moeperf.attribution.trace.Attribution.from_json`): the traced step at a batch, split;
* a serving run's JSON report (``--moeperf-report``, read by
  :func:`~pytest_moeperf.reports.document.benchmark_metrics`): the server's own TPOT (``engine_tpot_mean_ms``) of the
  closed-loop completions window at concurrency = batch (``load`` ``c<batch>``), the step as served.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pytest_moeperf.attribution.classify import ALL_REDUCE
from pytest_moeperf.attribution.trace import Attribution
from pytest_moeperf.kernels.budget.versus import MeasuredStep
from pytest_moeperf.reports.document import benchmark_metrics

__all__ = ["ENGINE_TPOT", "NoStepAtBatch", "measured_steps"]

#: the server's own mean TPOT of a serving window (`serving.analysis.arbiter`)
ENGINE_TPOT = "engine_tpot_mean_ms"
#: the ``endpoint`` context of a completions window (``serving.load.loadgen.Endpoint.COMPLETIONS``)
COMPLETIONS = "/v1/completions"


class NoStepAtBatch(ValueError):
    """A readable file that holds no measured step at the batch asked for."""


def _traced(records: list[Any], path: Path, batch: int) -> MeasuredStep:
    found = [Attribution.from_json(r) for r in records]
    match = [a for a in found if a.batch == batch]
    if not match:
        raise NoStepAtBatch(f"no attribution at batch {batch} (batches: "
                         f"{', '.join(str(a.batch) for a in found) or 'none'})")
    a = match[0]
    return MeasuredStep(a.step_us, batch, f"{path.name} ({a.device} trace, {a.steps} steps, {Path(a.source).name})",
                        True, a.component_us.get(ALL_REDUCE, 0.0) > 0, dict(a.component_us), a.idle_us,
                        idle_label=a.idle_label)


def _served(document: Any, path: Path, batch: int, profile: str | None) -> MeasuredStep:
    load = f"c{batch}"
    rows = [(ctx, median) for _key, metric, unit, ctx, median in benchmark_metrics(document)
            if metric == ENGINE_TPOT and unit == "ms" and ctx.get("load") == load
            and ctx.get("endpoint", COMPLETIONS) == COMPLETIONS]
    profiles = sorted({str(ctx.get("profile")) for ctx, _ in rows})
    if profile is not None:
        rows = [(ctx, m) for ctx, m in rows if ctx.get("profile") == profile]
    if not rows:
        raise NoStepAtBatch(f"no {ENGINE_TPOT} of a closed-loop completions window at {load}"
                         + (f" for profile {profile!r}" if profile else "")
                         + f" (profiles with one: {', '.join(profiles) or 'none'})")
    if len({str(ctx.get("profile")) for ctx, _ in rows}) > 1:
        raise ValueError(f"{load} windows of several profiles ({', '.join(profiles)}): name one with "
                         "--measured-profile")
    ctx, median = rows[0]
    tp = int(ctx.get("tp") or 1)
    return MeasuredStep(median * 1000.0, batch, f"{path.name}: {ENGINE_TPOT} of {ctx.get('profile')}'s {load} window "
                        f"(TP={tp}; the median over its rounds)", False, tp > 1)


def measured_steps(paths: list[Path], batch: int, profile: str | None = None
                   ) -> tuple[MeasuredStep | None, MeasuredStep | None]:
    """``(traced, served)`` at ``batch`` from ``moeperf attribute --json`` files and serving reports (the first of
    each kind that has the batch; a file without that batch is passed over while another has it); ``ValueError``
    naming the file when one cannot be read, or when none holds a step at ``batch``."""
    traced: MeasuredStep | None = None
    served: MeasuredStep | None = None
    absent: list[str] = []
    for path in paths:
        try:
            document = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ValueError(f"--measured {path}: {exc}") from None
        try:
            if isinstance(document, list):
                traced = traced or _traced(document, path, batch)
            elif isinstance(document, dict) and "benchmarks" in document:
                served = served or _served(document, path, batch, profile)
            else:
                raise ValueError("neither a `moeperf attribute --json` list nor a moeperf JSON report")
        except NoStepAtBatch as exc:
            absent.append(f"--measured {path}: {exc}")
        except ValueError as exc:
            raise ValueError(f"--measured {path}: {exc}") from None
    if traced is None and served is None:
        raise ValueError("; ".join(absent) or "--measured: no file given")
    return traced, served
