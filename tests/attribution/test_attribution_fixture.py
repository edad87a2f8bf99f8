"""The ``attribution`` fixture in a real pytest session: per-component µs recorded as gated perf metrics
(lower is better), shares in their context and in the report table. Fed the real 2×H200 trace kept under
``data/`` (no GPU here); the end-to-end path against a live server is test_attribute_real_server.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pytest_moeperf.attribution.classify import COMPONENTS
from pytest_moeperf.attribution.plugin import metric_name

H200_TRACE = Path(__file__).parent / "data" / "h200x2-graph-and-eager_rank0.pt.trace.json.gz"

TEST_FILE = f"""
from pathlib import Path

def test_graph_steps(attribution):
    a = attribution.from_trace(Path({str(H200_TRACE)!r}), batch=8)
    assert a.device == "gpu"
"""


def test_metric_names() -> None:
    assert [metric_name(c) for c in COMPONENTS] == ["attr_all_reduce_us", "attr_routed_expert_gemm_us",
                                                    "attr_dense_gemm_us", "attr_attention_us", "attr_other_us"]


def test_fixture_records_microseconds_and_reports_shares(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("hta")
    pytester.makepyfile(test_attr=TEST_FILE)
    report = pytester.path / "report.json"
    result = run_moeperf("-p", "pytest_moeperf.attribution.plugin", f"--moeperf-report={report}")
    result.assert_outcomes(passed=1)
    data = json.loads(report.read_text())
    metrics = {b["extra_info"]["metric"]: b for b in data["benchmarks"]}
    assert set(metrics) == {*(metric_name(c) for c in COMPONENTS), "attr_idle_us", "attr_step_us"}
    for bench in metrics.values():
        assert (bench["extra_info"]["unit"], bench["extra_info"]["better"]) == ("us", "lower")
        assert bench["extra_info"]["batch"] == 8 and bench["extra_info"]["trace_device"] == "gpu"
    step = metrics["attr_step_us"]["stats"]["median"]
    parts = sum(b["stats"]["median"] for name, b in metrics.items() if name != "attr_step_us")
    assert parts == pytest.approx(step, rel=0.05)
    shares = sum(b["extra_info"]["share_pct"] for name, b in metrics.items() if name != "attr_step_us")
    assert shares == pytest.approx(100.0, abs=0.1)
    assert metrics["attr_idle_us"]["extra_info"]["component"] == "GPU idle (launch gaps)"
    (section,) = [s for s in data["moeperf"]["sections"] if s["title"].startswith("Decode-step attribution")]
    assert section["title"] == "Decode-step attribution (gpu trace): batch=8"
    assert [r[0] for r in section["rows"]] == [*COMPONENTS, "GPU idle (launch gaps)", "step (traced)"]
