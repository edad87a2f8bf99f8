"""From a real session's ``--moeperf-report`` to the history and the HTML report.

The HTML check parses the file and decodes every image instead of screenshotting it in a browser: what can break
here is the file's self-containment (an image not embedded, a broken data URI, a fetched script), and a parse sees
exactly that, on every CI run, in well under a second, where a browser test needs a 300 MB Chromium in the test
environment and can only say "not blank". The README's screenshot (docs/img/report.png) is Chromium's rendering of
such a file, made once by hand.
"""

from __future__ import annotations

import base64
import json
import warnings
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from pytest_moeperf.history.plugin import HistoryWarning, record_report, record_session, write_html
from pytest_moeperf.history.records import ReportFormatError, records_from_report
from pytest_moeperf.history.store import HistoryStore
from tests.history.sessions import KEY, report_doc

SUITE = """
import os

def test_decode_step(perf):
    scale = float(os.environ.get("MOEPERF_TEST_SCALE", "1.0"))
    perf.record("latency", [x * scale for x in (10.0, 10.1, 9.9, 10.05, 9.95, 10.02, 9.98)], unit="ms")
    perf.record("throughput", [100.0 / scale, 101.0 / scale, 99.0 / scale], unit="tok/s", better="higher")

def test_new_metric(perf):
    perf.record("gemm_time", [5.0, 5.1, 4.9], unit="us")
"""


@pytest.fixture
def real_report(pytester: pytest.Pytester, run_moeperf: Any, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """A report written by a real session: baselines from a first run, then a 20 % slower run."""
    pytester.makepyfile(test_suite=SUITE)
    for _ in range(3):  # a baseline decides once it has 3 runs
        run_moeperf("--moeperf-update", "-k", "decode_step").assert_outcomes(passed=1, deselected=1)
    monkeypatch.setenv("MOEPERF_TEST_SCALE", "1.2")
    run_moeperf("--moeperf-report", "report.json").assert_outcomes(passed=1, failed=1)
    doc: dict[str, Any] = json.loads((pytester.path / "report.json").read_text())
    return doc


def test_records_from_a_real_report(real_report: dict[str, Any]) -> None:
    run, metrics = records_from_report(real_report, "2026-11-30T10:00:00+01:00")
    assert run.started == "2026-11-30T09:00:00+00:00" and run.finished.endswith("+00:00")
    assert run.fingerprint and len(run.fingerprint_hash) >= 8 and run.host
    assert "python" in run.versions
    by_key = {m.key: m for m in metrics}
    latency = by_key["test_suite.py::test_decode_step::latency"]
    assert (latency.status, latency.unit, latency.better) == ("REGRESSED", "ms", "lower")
    assert latency.n % 7 == 0  # 7 samples a round; a regression is confirmed by re-running the test
    assert latency.change == pytest.approx(0.2) and latency.baseline == pytest.approx(10.0)
    assert latency.median == pytest.approx(12.0) and latency.allowed is not None
    assert by_key["test_suite.py::test_decode_step::throughput"].change == pytest.approx(-1 / 6)
    gemm = by_key["test_suite.py::test_new_metric::gemm_time"]
    assert (gemm.status, gemm.baseline, gemm.change) == ("NEW", None, None)


def test_adapter_tolerates_extra_and_missing_optional_keys() -> None:
    doc = report_doc(0, {KEY: 100.0}, status="INCONCLUSIVE", baseline=None)
    doc["benchmarks"][0]["extra_info"].pop("allowed")
    doc["benchmarks"][0]["extra_info"]["min_effect"] = 0.02
    doc["commit_info"] = {}
    run, [metric] = records_from_report(doc)
    assert run.git_commit is None and not run.git_dirty
    assert (metric.status, metric.allowed, metric.baseline, metric.change) == ("INCONCLUSIVE", None, None, None)
    del doc["machine_info"]["moeperf"]
    with pytest.raises(ReportFormatError, match="fingerprint"):
        records_from_report(doc)


class Page(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.images: list[str] = []
        self.external: list[str] = []
        self.tables: list[dict[str, str | None]] = []
        self.headers: list[str] = []
        self._in_th = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        found = dict(attrs)
        if tag == "img":
            self.images.append(found.get("src") or "")
        if tag == "table":
            self.tables.append(found)
        for name in ("src", "href"):
            if tag != "img" and found.get(name):
                self.external.append(f"{tag} {name}={found[name]}")
        self._in_th = tag == "th"

    def handle_data(self, data: str) -> None:
        if self._in_th:
            self.headers.append(data)
            self._in_th = False


def decoded(src: str) -> tuple[str, bytes]:
    head, _, payload = src.partition(",")
    assert head.startswith("data:") and head.endswith(";base64"), src[:60]
    return head[5:].removesuffix(";base64"), base64.b64decode(payload, validate=True)


def test_html_of_a_real_report_embeds_every_image(real_report: dict[str, Any], tmp_path: Path) -> None:
    history = str(tmp_path / "history.sqlite")
    for i, value in enumerate((10.0, 10.05, 9.95, 10.02)):  # earlier sessions of the regressed metric
        earlier = json.loads(json.dumps(real_report))
        earlier["datetime"] = f"2026-11-0{i + 1}T00:00:00+00:00"
        for bench in earlier["benchmarks"]:
            bench["stats"]["median"], bench["extra_info"]["verdict"] = value, "PASS"
        assert record_report(earlier, history) is not None
    assert record_report(real_report, history) is not None
    page_path = tmp_path / "out" / "report.html"
    assert write_html(page_path, real_report, history)
    text = page_path.read_text()
    page = Page()
    page.feed(text)
    assert len(page.images) == 3, "the session chart and the trends of the regressed latency and throughput"
    for src in page.images:
        mime, data = decoded(src)
        if mime == "image/png":
            assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
        else:
            assert mime == "image/svg+xml" and ET.fromstring(data).tag.endswith("svg")
    assert page.external == [], "nothing is fetched: no src or href outside images"
    assert "http://" not in text.replace("http://www.w3.org", "") and "https://" not in text
    assert {"class": "sortable", "id": "verdicts"} in page.tables
    assert ["metric", "unit", "better", "baseline", "current", "n", "IQR", "Δ", "tol", "verdict"] == page.headers[:10]
    assert "test_suite.py::test_decode_step::latency" in text and "REGRESSED" in text
    assert text.index("<h2>History of flagged metrics</h2>") < text.index("trend of test_suite.py::test_decode_step")


def test_a_failed_write_warns_and_stores_nothing(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    run, metrics = records_from_report(report_doc(0, {KEY: 100.0}))
    with pytest.warns(HistoryWarning, match="moeperf history not written: cannot open history"):
        assert record_session(run, metrics, str(blocker / "history.sqlite")) is None
    with pytest.warns(HistoryWarning, match="no benchmarks list"):
        assert record_report({"machine_info": {}}, str(tmp_path / "h.sqlite")) is None
    target = str(tmp_path / "h.sqlite")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert record_session(run, metrics, target) == 1
    with pytest.warns(HistoryWarning, match="HTML report not written"):
        assert not write_html(blocker / "report.html", report_doc(0, {KEY: 100.0}), target)
    with HistoryStore.open(target) as store:
        assert len(store.runs()) == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # -W error: the message goes to stderr, nothing raises out of the session
        assert record_session(run, metrics, str(blocker / "history.sqlite")) is None


def test_html_shows_a_gpu_topology_and_the_extra_tables_escaped_in_svg() -> None:
    from pytest_moeperf.history.html import html_report
    from pytest_moeperf.machine.topology import load_topology

    topo = load_topology("8x-rtx-pro-6000-pcie")
    doc = report_doc(0, {KEY: 130.0}, status="REGRESSED")
    doc["machine_info"]["moeperf"] = {"fingerprint": topo.fingerprint.slug, "hash": topo.fingerprint.hash,
                                      "topology": topo.to_json()}
    doc["moeperf"] = {"sections": [{"title": "Decode-step budget <tp8>", "columns": ["component", "share"],
                                    "rows": [["all-reduce", "51.5 %"], ["experts & router", "12 %"]],
                                    "note": "from this run's GEMMs"}]}
    text = html_report(doc, fmt="svg")
    page = Page()
    page.feed(text)
    [chart] = page.images
    mime, data = decoded(chart)
    assert mime == "image/svg+xml" and ET.fromstring(data).tag.endswith("svg")
    assert text.count("RTX PRO 6000") >= 8, "one row per GPU"
    assert "Decode-step budget &lt;tp8&gt;" in text and "experts &amp; router" in text
    assert page.headers[-2:] == ["component", "share"]


def test_the_html_report_gets_the_mode_of_every_other_report(pytester: pytest.Pytester, run_moeperf: Any) -> None:
    """It was written 0600 (mkstemp's mode) while the JSON and Markdown reports were 0666 less the umask (issue 22,
    item 9): an HTML report published from CI or shared on a box could not be read by anyone else."""
    import os
    import stat

    pytester.makepyfile(test_suite=SUITE)
    old = os.umask(0o022)
    try:
        result = run_moeperf("--moeperf-update", "-k", "decode_step", "--moeperf-html", "out/report.html",
                             "--moeperf-report", "out/report.json")
    finally:
        os.umask(old)
    result.assert_outcomes(passed=1, deselected=1)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in (pytester.path / "out").iterdir()}
    assert modes == {"report.html": 0o644, "report.json": 0o644}, modes  # and no temporary file left beside them
