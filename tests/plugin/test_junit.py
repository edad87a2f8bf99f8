"""--junitxml carries each metric's value, baseline, change, threshold and verdict as test properties."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import pytest

SUITE = """
import os

def test_decode(perf):
    scale = float(os.environ.get("SCALE", "1"))
    perf.record("latency", [10.0 * scale, 10.1 * scale, 9.9 * scale, 10.0 * scale], unit="us")
"""


def properties(path) -> dict[str, str]:  # type: ignore[no-untyped-def]
    root = ET.parse(path).getroot()
    return {p.get("name", ""): p.get("value", "") for p in root.iter("property")}


def test_junit_xml_holds_the_metric_properties(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    pytester.makepyfile(test_junit_suite=SUITE)
    for _ in range(3):
        run_moeperf("--moeperf-update", "--moeperf-history", "off").assert_outcomes(passed=1)
    monkeypatch.setenv("SCALE", "1.5")
    xml = pytester.path / "junit.xml"
    result = run_moeperf("--moeperf-history", "off", f"--junitxml={xml}")
    result.assert_outcomes(failed=1)
    props = properties(xml)
    value = props["moeperf:latency"]
    assert value.startswith("REGRESSED; current 15 us; baseline 10 us (3 run(s)); change +50.00 %"), value
    assert "mde" in value
