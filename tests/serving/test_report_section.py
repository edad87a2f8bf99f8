"""The draft-candidate table is built from what the spec-decode tests recorded, and only from that."""

from __future__ import annotations

from typing import Any

from pytest_moeperf.ledger import Measurement
from pytest_moeperf.serving.plugin import pytest_moeperf_report_sections


def m(test: str, name: str, samples: tuple[float, ...], **context: Any) -> Measurement:
    return Measurement(test_id=test, name=name, samples=samples, unit="x", better="lower", context=context)


def test_table_rows_per_profile_and_concurrency() -> None:
    ngram = {"profile": "cpu-tiny-ngram", "spec_method": "ngram", "concurrency": 1}
    nospec = {"profile": "cpu-tiny-nospec", "spec_method": "none", "concurrency": 1}
    measurements = [
        m("d[ngram]", "tpot_ms", (3.0, 9.0, 4.0), **ngram),
        m("d[ngram]", "engine_tpot_mean_ms", (2.5,), **ngram),
        m("d[ngram]", "output_throughput", (300.0,), **ngram),
        m("d[ngram]", "acceptance_length", (3.8,), **ngram),
        m("d[ngram]", "acceptance_rate", (0.93,), **ngram),
        m("s[ngram]", "speedup", (1.5, 2.5, 2.0, 1.0), **ngram),
        m("d[nospec]", "tpot_ms", (6.0,), **nospec),
        m("d[nospec]", "output_throughput", (150.0,), **nospec),
        m("serving", "tpot_ms", (1.0,), profile="cpu-tiny-nospec", concurrency=1),  # no spec_method: not a row
    ]
    (section,) = pytest_moeperf_report_sections(None, measurements)  # type: ignore[arg-type]
    assert section.title == "Speculative decoding: draft candidates"
    rows = {r[0]: r for r in section.rows}
    assert set(rows) == {"cpu-tiny-ngram", "cpu-tiny-nospec"}
    assert rows["cpu-tiny-ngram"][3:] == ("3.80", "93.0%", "2.50", "300.0", "1.75x")  # engine TPOT, median speedup
    assert rows["cpu-tiny-nospec"][3:] == ("-", "-", "6.00", "150.0", "-")


def test_no_spec_measurements_no_table() -> None:
    assert pytest_moeperf_report_sections(None, [m("t", "tpot_ms", (1.0,), profile="p")]) == []  # type: ignore[arg-type]
