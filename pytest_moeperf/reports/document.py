"""The session's report document: the pytest-benchmark JSON schema (``pytest-benchmark compare`` reads it), with
the whole ledger under ``moeperf`` — one shape whether the session ran one round or ``--moeperf-rounds N``. The
JSON report, the history and the HTML report are made from it, and a ``--moeperf-rounds`` parent reads its
children's ledgers back from it (`ledger_of`).

pytest-benchmark reads every ``stats`` as seconds. So (report schema 2, ``moeperf.report_schema``) a metric timed
in ``s``, ``ms``, ``us`` or ``ns`` has its ``stats`` in seconds and its own unit and numbers in ``extra_info``
(``unit``, ``metric_stats``); a metric of any other unit (GB/s, tok/s, %) is kept out of ``benchmarks``, under
``moeperf.non_time_benchmarks``, in the same entry shape with ``stats`` in its own unit. `metric_entries` is the one
reader: every metric's entry with ``stats`` in its own unit, from this schema and from schema 1 (no
``report_schema``: every metric in ``benchmarks``, ``stats`` in its own unit)."""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_moeperf.judging.verdict import Verdict
from pytest_moeperf.ledger import Ledger, Section

BENCHMARK_JSON_VERSION = "5.2.3"  # the pytest-benchmark report version whose schema we follow
REPORT_SCHEMA = 2  # ``moeperf.report_schema``; see the module docstring
#: the units whose values pytest-benchmark may show, as seconds: unit -> seconds per unit
TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ns": 1e-9}
#: a metric's own numbers kept in ``extra_info.metric_stats`` when its ``stats`` are in seconds
METRIC_STATS = ("median", "mean", "min", "max", "stddev", "iqr", "q1", "q3")


def document(ledger: Ledger, machine_info: dict[str, Any], commit_info: dict[str, Any],
             moeperf: Mapping[str, Any], samples: Mapping[str, list[float]] | None = None,
             extra: Sequence[Verdict] = ()) -> dict[str, Any]:
    """The report of ``ledger``; ``moeperf`` adds session facts (fingerprint, host, update) beside the ledger.
    ``samples``: each metric's ``stats.data`` when it is not every round's samples pooled (``moeperf ab``: the head
    side's process medians, which its verdicts summarise). ``extra``: entries that are no metric of the ledger, in
    the same shape (the canary's figures, `judging.machine.canary_verdicts`: the history keeps their series)."""
    contexts = {k: dict(r.metric.context) for k, r in ledger.records.items()}
    if samples is None:
        samples = {k: [x for rnd in r.rounds for x in rnd.samples] for k, r in ledger.records.items()}
    doc = benchmark_json([*ledger.verdicts, *extra], contexts, samples, machine_info, commit_info, ledger.sections)
    doc["moeperf"] = {**doc["moeperf"], **ledger.to_json(), **moeperf}
    return doc


def ledger_of(doc: Mapping[str, Any]) -> Ledger:
    """The ledger a report document carries (`ValueError` when it carries none this version reads)."""
    section = doc.get("moeperf")
    if not isinstance(section, Mapping):
        raise ValueError("not a moeperf report (no 'moeperf' section)")
    return Ledger.from_json(section)


def benchmark_json(verdicts: Sequence[Verdict], contexts: dict[str, dict[str, Any]], samples: Mapping[str, list[float]],
                   machine_info: dict[str, Any], commit_info: dict[str, Any],
                   sections: Sequence[Section]) -> dict[str, Any]:
    """A report in the pytest-benchmark JSON schema (``pytest-benchmark compare`` reads it): time metrics in
    ``benchmarks`` with ``stats`` in seconds, the others under ``moeperf.non_time_benchmarks`` (module docstring)."""
    benchmarks: list[dict[str, Any]] = []
    others: list[dict[str, Any]] = []
    for v in verdicts:
        s = v.current
        if s is None:
            continue  # MISSING: listed in the report's "moeperf" section
        test_id, _, metric = v.key.rpartition("::")
        data = samples.get(v.key, [])
        entry = {
            "group": test_id.split("::", 1)[0],
            "name": f"{test_id.rpartition('::')[2]}::{metric}",
            "fullname": v.key,
            "params": contexts.get(v.key, {}),
            "param": None,
            "extra_info": {
                "metric": metric, "unit": v.unit, "better": v.better, "verdict": v.status.value,
                "baseline_median": v.reference, "baseline_runs": v.runs, "change": v.change,
                "allowed": v.mde, "mde": v.mde, "spread": v.spread, "reason": v.reason,
                "round_medians": list(v.round_medians), **contexts.get(v.key, {}),
            },
            "options": {"disable_gc": False, "timer": "moeperf", "min_rounds": 1, "max_time": 0,
                        "min_time": 0, "warmup": False},
            "stats": {
                "min": s.min, "max": s.max, "mean": s.mean, "stddev": s.stddev, "rounds": s.n,
                "median": s.median, "iqr": s.iqr, "q1": s.q1, "q3": s.q3, "iqr_outliers": 0,
                "stddev_outliers": 0, "outliers": "0;0", "ld15iqr": s.min, "hd15iqr": s.max,
                "ops": (1.0 / s.mean) if s.mean else 0.0, "total": sum(data) if data else s.mean * s.n,
                "data": data, "iterations": 1,
            },
        }
        scale = TIME_UNITS.get(v.unit)
        if scale is None:
            others.append(entry)
        else:
            benchmarks.append(_in_seconds(entry, scale))
    return {
        "machine_info": machine_info,
        "commit_info": commit_info,
        "benchmarks": benchmarks,
        "datetime": dt.datetime.now(dt.UTC).isoformat(),
        "version": BENCHMARK_JSON_VERSION,
        "moeperf": {"report_schema": REPORT_SCHEMA, "non_time_benchmarks": others,
                    "sections": [x.to_json() for x in sections]},
    }


def _in_seconds(entry: dict[str, Any], scale: float) -> dict[str, Any]:
    """A time metric's entry with its ``stats`` in seconds; its own numbers stay in ``extra_info.metric_stats``."""
    stats = entry["stats"]
    entry["extra_info"]["metric_stats"] = {k: stats[k] for k in METRIC_STATS}
    seconds = {k: stats[k] * scale for k in (*METRIC_STATS, "ld15iqr", "hd15iqr", "total")}
    seconds["data"] = [x * scale for x in stats["data"]]
    seconds["ops"] = 1.0 / seconds["mean"] if seconds["mean"] else 0.0
    entry["stats"] = {**stats, **seconds}
    return entry




def base_machine_info() -> dict[str, Any]:
    uname = platform.uname()
    return {
        "node": uname.node, "processor": uname.processor, "machine": uname.machine,
        "python_compiler": platform.python_compiler(), "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(), "python_version": platform.python_version(),
        "python_build": list(platform.python_build()), "release": uname.release, "system": uname.system,
    }





def metric_entries(document: Any) -> list[Any]:
    """Every metric's entry of a parsed report, ``stats`` in the metric's own unit (``extra_info.unit``), of report
    schema 2 or 1 (the module docstring); entries are returned as found where they need no change. ``ValueError``
    when it is no report."""
    if not isinstance(document, Mapping) or not isinstance(document.get("benchmarks"), list):
        raise ValueError("not a moeperf JSON report: no benchmarks list")
    section = document.get("moeperf")
    schema = section.get("report_schema", 1) if isinstance(section, Mapping) else 1
    if schema == 1:
        return list(document["benchmarks"])
    if schema != REPORT_SCHEMA or not isinstance(section, Mapping):
        raise ValueError(f"report schema {schema!r}; this version reads 1 and {REPORT_SCHEMA}")
    others = section.get("non_time_benchmarks", [])
    if not isinstance(others, list):
        raise ValueError("moeperf.non_time_benchmarks must be a list")
    entries: list[Any] = []
    for b in document["benchmarks"]:
        value = b.get("extra_info", {}).get("metric_stats") if isinstance(b, Mapping) else None
        stats = b.get("stats") if isinstance(b, Mapping) else None
        if isinstance(value, Mapping) and isinstance(stats, Mapping):  # a time metric: its own numbers
            b = {**b, "stats": {**{k: v for k, v in stats.items() if k in ("rounds", "iterations")}, **value}}
        entries.append(b)
    return entries + others


def benchmark_metrics(document: Any) -> list[tuple[str, str, str, dict[str, Any], float]]:
    """The metrics of a parsed report written by :func:`benchmark_json`: ``(key, metric, unit, context, median)``
    each, the median in the metric's own unit (read through `metric_entries`). ``ValueError`` when it is not one."""
    out = []
    for i, b in enumerate(metric_entries(document)):
        try:
            info = b.get("extra_info", {})
            out.append((str(b.get("fullname", "")), str(info.get("metric", "")), str(info.get("unit", "")),
                        dict(b.get("params") or {}), float(b["stats"]["median"])))
        except (AttributeError, KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"benchmarks[{i}] is malformed ({type(exc).__name__}: {exc})") from None
    return out


def report_fingerprint(document: Any) -> str | None:
    """The fingerprint slug of the box a report's session measured on (``moeperf.fingerprint``), None when the
    report does not say."""
    section = document.get("moeperf") if isinstance(document, dict) else None
    slug = section.get("fingerprint") if isinstance(section, Mapping) else None
    return slug if isinstance(slug, str) and slug else None
