"""Synthetic sessions as the core's JSON report documents (the pytest-benchmark schema of ``--moeperf-report``),
for history tests that need many sessions with known values; one real report comes from a pytester run."""

from __future__ import annotations

import datetime as dt
import random
from typing import Any

FINGERPRINT = {"fingerprint": "cpu-2c-test", "hash": "0123456789ab"}
KEY = "suites/test_decode.py::test_step[bf16-tp8]::latency"


def report_doc(index: int, values: dict[str, float], *, status: str = "PASS", baseline: float | None = 100.0,
               versions: dict[str, str] | None = None, commit: str | None = None,
               fingerprint: dict[str, str] | None = None) -> dict[str, Any]:
    """Session ``index`` (one hour apart) with one metric per entry of ``values`` (``test_id::name`` -> median)."""
    benchmarks = []
    for key, median in values.items():
        test_id, _, metric = key.rpartition("::")
        change = None if baseline is None else median / baseline - 1.0
        benchmarks.append({
            "fullname": key, "name": key.rpartition("::")[0].rpartition("::")[2] + "::" + metric,
            "extra_info": {"metric": metric, "unit": "ms", "better": "lower", "verdict": status,
                           "baseline_median": baseline, "change": change, "allowed": 0.1,
                           "reason": "a key the adapter does not know"},
            "stats": {"median": median, "rounds": 7, "iqr": median * 0.01, "min": median, "max": median},
        })
    moeperf = {**(fingerprint or FINGERPRINT),
               "topology": {"software": versions or {"torch": "2.13.0", "vllm": "0.32.0"}, "gpus": [],
                            "host": {"cpu_model": "test cpu", "cores": 2, "memory_bytes": 2**34, "arch": "x86_64"}}}
    finished = dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(hours=index)
    return {"machine_info": {"node": "runner-1", "python_version": "3.11.7", "moeperf": moeperf},
            "commit_info": {"id": commit or f"{index:04d}" + "c0ffee" * 6, "dirty": False},
            "benchmarks": benchmarks, "datetime": finished.isoformat(), "version": "5.2.3"}


def stepped_series(count: int = 20, step_at: int = 12, step: float = 0.10, noise: float = 0.01,
                   seed: int = 7) -> list[float]:
    """Medians around 100 with ``noise`` relative Gaussian scatter, ``step`` higher from ``step_at`` on."""
    rng = random.Random(seed)
    return [100.0 * (1.0 + (step if i >= step_at else 0.0)) * (1.0 + rng.gauss(0.0, noise)) for i in range(count)]
