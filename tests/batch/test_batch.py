"""``moeperf batch`` as a user runs it: a real subprocess on a tiny selection of this checkout's suites, and on a
project of its own whose test leaves a server running, to check that the batch stops what it started, and only
that (a process that merely looks like a vLLM server, started elsewhere, survives)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pytest_moeperf.batch.plan import Attribution, Budget, Options, PytestRun, plan
from pytest_moeperf.batch.runner import Batch
from tests.plugin.test_starts import CONFTEST

ROOT = Path(__file__).parents[2]
#: generous: a batch starts pytest (and torch) several times; each test ends as soon as its batch does
BATCH_TIMEOUT_S = 900

LEAKY_TEST = """
import os, subprocess, sys, time

def test_leaves_a_server_running():
    # a server in a session of its own, as vLLM's is: it outlives the pytest that started it
    server = subprocess.Popen([sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "0"],
                              start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(os.environ["MOEPERF_TEST_PIDFILE"] + ".tmp", "w") as handle:
        handle.write(str(server.pid))
    os.rename(os.environ["MOEPERF_TEST_PIDFILE"] + ".tmp", os.environ["MOEPERF_TEST_PIDFILE"])
    if os.environ.get("MOEPERF_TEST_HANG"):
        time.sleep(3600)
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2] != "Z"


def _batch_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest_moeperf.cli", "batch", *args]


def _steps(out: Path) -> dict[str, dict[str, object]]:
    return {s["name"]: s for s in json.loads((out / "batch.json").read_text())["steps"]}


@pytest.fixture
def foreign() -> Iterator[subprocess.Popen[bytes]]:
    """A process the batch did not start, whose command line reads like a vLLM server's."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(900)",
                             "vllm.entrypoints.openai.api_server", "--port", "1"], start_new_session=True)
    yield proc
    proc.kill()
    proc.wait()


@pytest.fixture
def leaky_project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A checkout whose kernel "suite" is one test that leaves a server running; the pid lands in a file."""
    project = tmp_path / "project"
    (project / "suites" / "allreduce").mkdir(parents=True)
    (project / "suites" / "gemm").mkdir()
    (project / "suites" / "allreduce" / "test_leak.py").write_text(LEAKY_TEST)
    monkeypatch.setenv("MOEPERF_TEST_PIDFILE", str(tmp_path / "server.pid"))
    return project


# ------------------------------------------------------------------------------------------------ the plan
def test_steps_run_in_order_with_the_aa_run_after_each_update_and_vllm_cases_measured_once() -> None:
    units, notes = plan(Options(steps=("budget", "kernels", "vllm-kernels", "topology"), update=True, aa=True,
                                rounds=3, kernels_k="kimi"), gpu_count=1, vllm=True)
    assert [u.name for u in units] == ["topology", "vllm-kernels", "vllm-kernels-aa", "kernels", "kernels-aa",
                                       "budget"]
    vllm_run, vllm_aa, kernels, kernels_aa = (u for u in units if isinstance(u, PytestRun))
    assert vllm_run.keyword == "(marlin or vllm_custom) and (kimi)"
    assert kernels.keyword == kernels_aa.keyword == "(kimi) and (not (marlin or vllm_custom))"
    assert (vllm_run.update, vllm_run.rounds, vllm_aa.update, vllm_aa.rounds) == (True, 3, False, 1)
    assert isinstance(units[-1], Budget) and units[-1].report == "kernels-aa"
    assert notes == []
    units, notes = plan(Options(steps=("vllm-kernels", "kernels"), quick=True), gpu_count=0, vllm=False)
    assert [(u.name, u.keyword, u.args) for u in units if isinstance(u, PytestRun)] == [
        ("kernels", None, ("--moeperf-quick",))]
    assert notes == ["vllm-kernels: vLLM does not import with this interpreter: its kernel cases skip"]


@pytest.mark.parametrize(("gpus", "selection"), [(0, "cpu-tiny"), (1, "gpu-tiny-tp1"), (2, "gpu-tiny-tp2")])
def test_serving_and_attribution_default_to_the_tiny_profiles_this_machine_serves(gpus: int, selection: str) -> None:
    units, _ = plan(Options(steps=("serving", "attribution")), gpu_count=gpus, vllm=True)
    serving, attribution = units
    assert isinstance(serving, PytestRun) and serving.keyword == selection
    assert isinstance(attribution, Attribution) and attribution.profile == f"{selection}-nospec"
    units, _ = plan(Options(steps=("attribution",), attribution=("a", "b:pcie-no-p2p"), crosscheck=True),
                    gpu_count=gpus, vllm=True)
    assert [(u.profile, u.emulation, u.crosscheck) for u in units if isinstance(u, Attribution)] == [
        ("a", None, True), ("b", "pcie-no-p2p", False)]


def test_the_rank_profile_is_the_attribution_target_and_not_in_the_default_serving_batch() -> None:
    """gpu-kimi-rank-tp1-nospec starts slowly (~76 GB): a 1-GPU box's default serving selection leaves it out, and
    `attribution --attribution gpu-kimi-rank-tp1-nospec` serves it (pytest's own -k on the real suite)."""
    (serving,), _ = plan(Options(steps=("serving",)), gpu_count=1, vllm=True)
    assert isinstance(serving, PytestRun) and serving.keyword is not None
    listed = subprocess.run([sys.executable, "-m", "pytest", "suites/serving", "--collect-only", "-q",
                             "-p", "no:cacheprovider", "-k", serving.keyword], cwd=ROOT, capture_output=True,
                            text=True, timeout=300)
    ids = [line for line in listed.stdout.splitlines() if "::" in line]
    assert ids and all("gpu-tiny-tp1-" in i for i in ids) and not any("kimi-rank" in i for i in ids)
    units, _ = plan(Options(steps=("attribution",), attribution=("gpu-kimi-rank-tp1-nospec",)), gpu_count=1,
                    vllm=True)
    assert [u.profile for u in units if isinstance(u, Attribution)] == ["gpu-kimi-rank-tp1-nospec"]


# ------------------------------------------------------------------------------------------------ bad input
@pytest.mark.parametrize(("args", "message"), [
    (["nosuch"], "unknown step 'nosuch'"),
    (["--aa"], "--aa needs --update"),
    (["--budget-allreduce-us", "30"], "--budget-allreduce-us needs --budget-topology"),
    (["--rounds", "0"], "--rounds: must be at least 1"),
    (["kernels", "--root", "{tmp}"], "no suites/allreduce under"),
    (["--out", "{tmp}"], "is not empty: name a new or empty folder"),
    (["--python", "{tmp}/no-python"], "--python: cannot run"),
])
def test_bad_input_is_one_line_naming_the_option(args: list[str], message: str, tmp_path: Path) -> None:
    (tmp_path / "something").write_text("")
    done = subprocess.run(_batch_argv(*(a.format(tmp=tmp_path) for a in args)), cwd=ROOT, capture_output=True,
                          text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 2 and message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr


# ------------------------------------------------------------------------------------------------ processes
def test_a_command_past_its_time_limit_gets_sigint(tmp_path: Path) -> None:
    batch = Batch(tmp_path, root=tmp_path, env=os.environ, deadline_s=None, echo=lambda line: None)
    # as `moeperf batch` does before it starts anything: with a handler of ours, SIGINT is back to its default in
    # the commands even where this process inherited it ignored (a background job of a script)
    previous = batch.install_signal_handlers()
    try:
        proc = batch.start([sys.executable, "-c", "import time; time.sleep(900)"], tmp_path / "sleep.log")
        outcome = batch.wait(proc, until=time.monotonic() + 1.0, grace_s=300.0)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    assert (outcome.status, outcome.cut) == ("cut", "cut at its time limit")
    assert outcome.rc == -signal.SIGINT and not _alive(proc.pid)  # ended by the SIGINT, within the grace


def test_the_batch_stops_the_server_its_suite_left_and_nothing_else(
        leaky_project: Path, foreign: subprocess.Popen[bytes], tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(_batch_argv("kernels", "--root", str(leaky_project), "--out", str(out)), cwd=tmp_path,
                          capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    server = int((tmp_path / "server.pid").read_text())
    assert not _alive(server)
    kernels = _steps(out)["kernels"]
    assert kernels["status"] == "ok"
    assert any(line.startswith(f"{server} ") and "http.server" in line for line in kernels["stopped"])  # type: ignore[attr-defined]
    assert foreign.poll() is None, "a process the batch did not start was stopped"
    assert "vllm.entrypoints.openai.api_server" in Path(f"/proc/{foreign.pid}/cmdline").read_text()
    summary = (out / "summary.txt").read_text()
    assert "kernels: stopped 1 process(es) it left running" in summary and "done: exit 0" in summary


def test_ctrl_c_interrupts_the_running_step_and_stops_what_it_started(
        leaky_project: Path, foreign: subprocess.Popen[bytes], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MOEPERF_TEST_HANG", "1")
    out, pidfile = tmp_path / "out", tmp_path / "server.pid"
    batch = subprocess.Popen(_batch_argv("kernels", "budget", "--root", str(leaky_project), "--out", str(out)),
                             cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        end = time.monotonic() + BATCH_TIMEOUT_S
        while not pidfile.exists():  # the event: the suite's test started its server and now hangs
            assert batch.poll() is None and time.monotonic() < end, batch.communicate()[0]
            time.sleep(0.2)
        batch.send_signal(signal.SIGINT)
        output = batch.communicate(timeout=BATCH_TIMEOUT_S)[0]
    finally:
        if batch.poll() is None:
            batch.kill()
            batch.wait()
    assert batch.returncode == 130, output
    assert not _alive(int(pidfile.read_text()))
    steps = _steps(out)
    assert steps["kernels"]["status"] == "cut" and str(steps["kernels"]["detail"]).startswith("interrupted")
    assert "budget" not in steps and "budget: not started (interrupted)" in output
    assert foreign.poll() is None


# ------------------------------------------------------------------------------------------------ real suites
def test_update_then_aa_then_budget_on_one_gemm_case(tmp_path: Path) -> None:
    out, baselines = tmp_path / "out", tmp_path / "baselines"
    done = subprocess.run(_batch_argv("kernels", "budget", "--update", "--kernels-k", "router and m1",
                                      "--baselines", str(baselines), "--out", str(out), "--",
                                      "--moeperf-history", "off", "--moeperf-health", "off",
                                      "--moeperf-canary", "off"),  # a loaded box
                          cwd=ROOT, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    steps = _steps(out)
    assert list(steps) == ["kernels", "kernels-aa", "budget"]
    assert all(s["status"] == "ok" and s["stopped"] == [] for s in steps.values()), steps
    update, aa = ((out / f"{name}.log").read_text().splitlines()[0] for name in ("kernels", "kernels-aa"))
    assert "--moeperf-update" in update and "--moeperf-update" not in aa
    assert all("-k router and m1" in line and "--moeperf-history off" in line for line in (update, aa))
    for name in ("kernels", "kernels-aa"):
        report = json.loads((out / f"{name}.json").read_text())
        assert [b["name"] for b in report["benchmarks"] if b["extra_info"]["metric"] == "time"] == [
            "test_gemm[kimi-k2.5-router-m1-bf16]::time"]
    assert "## Decode-step budget: kimi-k2.5, TP=8, batch=1" in (out / "budget.txt").read_text()
    summary = (out / "summary.txt").read_text()
    # the baselines sit outside any git checkout: the diff (against what git holds) is skipped, saying why
    assert f"moeperf baselines diff: skipped: {baselines} is not inside a git checkout" in summary, summary
    assert "done: exit 0" in summary
    # what the update wrote travels with the outputs (a lent machine's checkout does not come back)
    (slug,) = [p.name for p in baselines.iterdir() if p.is_dir()]
    kept = out / "baselines" / slug / "test_gemm.json"
    assert kept.read_text() == (baselines / slug / "test_gemm.json").read_text()
    assert f"copied to {out / 'baselines' / slug}" in summary


def test_an_attribution_whose_server_does_not_start_fails_that_step_with_the_reason(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(_batch_argv("attribution", "--attribution", "no-such-profile", "--out", str(out),
                                      "--model-cache", str(tmp_path / "models")),
                          cwd=ROOT, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 1, done.stdout + done.stderr
    (step,) = _steps(out).values()
    assert step["name"] == "attribution-no-such-profile-native" and step["status"] == "failed"
    assert "no healthy server: exited with code 2" in str(step["detail"])
    assert "no profile 'no-such-profile'" in str(step["detail"])


def test_a_run_whose_share_of_the_deadline_is_too_short_is_skipped_saying_so(tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = subprocess.run(_batch_argv("kernels", "--deadline", "20", "--out", str(out)), cwd=ROOT,
                          capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    kernels = _steps(out)["kernels"]
    assert kernels["status"] == "skipped" and "a round needs 30 s plus 40 s of grace" in str(kernels["detail"])
    assert not (out / "kernels.log").exists()


DEADLINE_SUITE = """
import os, time
import pytest

@pytest.mark.parametrize("case", range(5))
def test_case(perf, case):
    if case == 0 and os.environ.get("MOEPERF_TEST_SLOW"):
        time.sleep(float(os.environ["MOEPERF_TEST_SLOW"]))
    perf.record("time", [1.0, 1.1, 0.9], unit="us")
"""


def test_a_run_whose_deadline_skipped_tests_is_cut_and_names_them(tmp_path: Path) -> None:
    """Issue 30 item 14: ``moeperf batch serving --deadline 555`` printed ``serving: ok`` and exited 0 while its
    deadline had skipped 14 tests and 37 metrics were MISSING."""
    project, out, baselines = tmp_path / "project", tmp_path / "out", tmp_path / "baselines"
    (project / "suites" / "gemm").mkdir(parents=True)
    (project / "suites" / "allreduce").mkdir()
    (project / "suites" / "gemm" / "test_cases.py").write_text(DEADLINE_SUITE)
    (project / "pytest.ini").write_text("[pytest]\n")  # the rootdir, whichever of the paths passed exist
    common = ("kernels", "--root", str(project), "--baselines", str(baselines))
    pytest_args = ("--", "--moeperf-history", "off", "--moeperf-health", "off", "--moeperf-canary", "off")
    done = subprocess.run(_batch_argv(*common, "--update", "--no-aa", "--out", str(tmp_path / "update"),
                                      *pytest_args), cwd=project, capture_output=True, text=True,
                          timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    # pytest's --moeperf-deadline is 60 - 25 = 35 s; the first case takes 37 s, the batch's limit (60 s) is not hit
    done = subprocess.run(_batch_argv(*common, "--deadline", "60", "--grace", "25", "--out", str(out), *pytest_args),
                          cwd=project, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S,
                          env={**os.environ, "MOEPERF_TEST_SLOW": "37"})
    assert done.returncode == 1, done.stdout + done.stderr
    kernels = _steps(out)["kernels"]
    assert kernels["status"] == "cut", kernels
    detail = str(kernels["detail"])
    assert "--moeperf-deadline skipped 4 test(s)" in detail
    assert "suites/gemm/test_cases.py::test_case[1], suites/gemm/test_cases.py::test_case[2]" in detail
    assert "4 metric(s) MISSING" in detail
    assert "kernels: cut (" in (out / "summary.txt").read_text()


CACHE_SUITE = """
import os
from pathlib import Path

def test_case(perf):
    cache = Path(os.environ["MOEPERF_SERVE_CACHE"])
    seen = (cache / "compiled").exists()
    (cache / "compiled").parent.mkdir(parents=True, exist_ok=True)
    (cache / "compiled").touch()
    with open(os.environ["MOEPERF_TEST_SEEN"], "a") as handle:
        handle.write(f"{cache} {seen}\\n")
    perf.record("time", [1.0, 1.1, 0.9], unit="us")
"""


def test_a_later_batch_finds_what_an_earlier_one_left_in_the_servers_cache(tmp_path: Path) -> None:
    """Issue 28 item 1: the batch runs pytest without its cache (-p no:cacheprovider), and each session kept its
    servers' compile caches in a temporary folder, so every `moeperf batch serving` began with a cold start."""
    project, seen = tmp_path / "project", tmp_path / "seen.txt"
    (project / "suites" / "gemm").mkdir(parents=True)
    (project / "suites" / "allreduce").mkdir()
    (project / "suites" / "gemm" / "test_cache.py").write_text(CACHE_SUITE)
    (project / "pytest.ini").write_text("[pytest]\n")
    env = {k: v for k, v in os.environ.items() if k != "MOEPERF_SERVE_CACHE"}
    for i in range(2):
        done = subprocess.run(_batch_argv("kernels", "--root", str(project), "--baselines", str(tmp_path / "bl"),
                                          "--update", "--no-aa", "--out", str(tmp_path / f"out{i}"), "--",
                                          "--moeperf-history", "off", "--moeperf-health", "off",
                                          "--moeperf-canary", "off"),
                              cwd=project, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S,
                              env={**env, "MOEPERF_TEST_SEEN": str(seen)})
        assert done.returncode == 0, done.stdout + done.stderr
    assert seen.read_text().splitlines() == [f"{project / '.moeperf'} False", f"{project / '.moeperf'} True"]


STARTS_CONFTEST = CONFTEST  # the start marker and its round unit, as tests/plugin/test_starts.py declares them
STARTS_SUITE = """
import time
import pytest

@pytest.mark.start
def test_window(perf):
    time.sleep(12)
    perf.record("tpot_ms", [2.0, 2.01, 1.99], unit="ms")
"""


def test_a_start_the_deadline_did_not_let_begin_is_said_not_cut(tmp_path: Path) -> None:
    """On 1x H200 a judged batch of 2 warm starts (of the 3 asked) measured every test and read 'cut', exit 1: the
    start not begun counted its 23 tests as skipped by the deadline. A test measured on an earlier start was
    measured: the step is ok and says that a start was not begun."""
    project, out = tmp_path / "project", tmp_path / "out"
    (project / "suites" / "gemm").mkdir(parents=True)
    (project / "suites" / "allreduce").mkdir()
    (project / "suites" / "gemm" / "conftest.py").write_text(STARTS_CONFTEST)
    (project / "suites" / "gemm" / "test_window.py").write_text(STARTS_SUITE)
    (project / "pytest.ini").write_text("[pytest]\n")
    # pytest's --moeperf-deadline: 62 - 30 = 32 s; a start takes 14 s or more (its child session, the 12 s test):
    # start 3 is never begun, start 2 only when start 1 left it time (a busy box: not)
    done = subprocess.run(_batch_argv("kernels", "--root", str(project), "--baselines", str(tmp_path / "bl"),
                                      "--update", "--no-aa", "--deadline", "62", "--grace", "30", "--out", str(out),
                                      "--", "--moeperf-starts", "3", "--moeperf-history", "off",
                                      "--moeperf-health", "off", "--moeperf-canary", "off"),
                          cwd=project, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 0, done.stdout + done.stderr
    kernels = _steps(out)["kernels"]
    assert kernels["status"] == "ok", kernels
    assert " not begun: " in str(kernels["detail"]) and "its verdicts rest on " in str(kernels["detail"])


def test_a_step_whose_tests_all_skip_measured_nothing_and_fails(tmp_path: Path) -> None:
    """Seen on 1x H200: a serving step on a box where vLLM did not import read `serving: ok`, exit 0, after all its
    tests skipped. Here a GPU profile on a box without one: the step fails and says why."""
    out = tmp_path / "out"
    done = subprocess.run(_batch_argv("serving", "--serving-k", "gpu-kimi-rank-tp1-nospec and startup", "--out",
                                      str(out), "--baselines", str(tmp_path / "baselines")),
                          cwd=ROOT, capture_output=True, text=True, timeout=BATCH_TIMEOUT_S)
    assert done.returncode == 1, done.stdout + done.stderr
    (step,) = _steps(out).values()
    assert step["status"] == "failed", step
    assert str(step["detail"]).startswith("measured nothing: all 1 selected test(s) skipped (profile "), step
    assert "serving failed" in (out / "summary.txt").read_text()
