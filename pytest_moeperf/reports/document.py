"""The session's report document: the pytest-benchmark JSON schema (``pytest-benchmark compare`` reads it), with
the whole ledger under ``moeperf`` — one shape whether the session ran one round or ``--moeperf-rounds N``. The
JSON report, the history and the HTML report are made from it, and a ``--moeperf-rounds`` parent reads its
children's ledgers back from it (`ledger_of`)."""

from __future__ import annotations

import datetime as dt
import platform
from collections.abc import Mapping, Sequence
from typing import Any

from pytest_moeperf.judging.verdict import Verdict
from pytest_moeperf.ledger import Ledger, Section

BENCHMARK_JSON_VERSION = "5.2.3"  # the pytest-benchmark report version whose schema we follow


def document(ledger: Ledger, machine_info: dict[str, Any], commit_info: dict[str, Any],
             moeperf: Mapping[str, Any], samples: Mapping[str, list[float]] | None = None) -> dict[str, Any]:
    """The report of ``ledger``; ``moeperf`` adds session facts (fingerprint, host, update) beside the ledger.
    ``samples``: each metric's ``stats.data`` when it is not every round's samples pooled (``moeperf ab``: the head
    side's process medians, which its verdicts summarise)."""
    contexts = {k: dict(r.metric.context) for k, r in ledger.records.items()}
    if samples is None:
        samples = {k: [x for rnd in r.rounds for x in rnd.samples] for k, r in ledger.records.items()}
    doc = benchmark_json(ledger.verdicts, contexts, samples, machine_info, commit_info, ledger.sections)
    doc["moeperf"] = {**ledger.to_json(), **moeperf}
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
    """A report in the pytest-benchmark JSON schema (``pytest-benchmark compare`` reads it). Values keep the
    metric's own unit (``extra_info.unit``); pytest-benchmark shows them as if they were seconds."""
    benchmarks = []
    for v in verdicts:
        s = v.current
        if s is None:
            continue  # MISSING: listed in the report's "moeperf" section
        test_id, _, metric = v.key.rpartition("::")
        data = samples.get(v.key, [])
        benchmarks.append({
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
        })
    return {
        "machine_info": machine_info,
        "commit_info": commit_info,
        "benchmarks": benchmarks,
        "datetime": dt.datetime.now(dt.UTC).isoformat(),
        "version": BENCHMARK_JSON_VERSION,
        "moeperf": {"sections": [x.to_json() for x in sections]},
    }




def base_machine_info() -> dict[str, Any]:
    uname = platform.uname()
    return {
        "node": uname.node, "processor": uname.processor, "machine": uname.machine,
        "python_compiler": platform.python_compiler(), "python_implementation": platform.python_implementation(),
        "python_implementation_version": platform.python_version(), "python_version": platform.python_version(),
        "python_build": list(platform.python_build()), "release": uname.release, "system": uname.system,
    }





def benchmark_metrics(document: Any) -> list[tuple[str, str, str, dict[str, Any], float]]:
    """The metrics of a parsed report written by :func:`benchmark_json`: ``(key, metric, unit, context, median)``
    each (the one reader of the format whose writer is above). ``ValueError`` when it is not one."""
    if not isinstance(document, dict) or not isinstance(document.get("benchmarks"), list):
        raise ValueError("not a moeperf JSON report (no 'benchmarks' list)")
    out = []
    for i, b in enumerate(document["benchmarks"]):
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
