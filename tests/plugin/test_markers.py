"""Markers and the topology fixture on a loaded topology file (the 8x RTX PRO 6000 PCIe box)."""

from __future__ import annotations

import pytest

MARKED_TESTS = """
import pytest

@pytest.mark.gpus(8)
@pytest.mark.interconnect("pcie")
def test_eight_pcie(topology):
    assert topology.gpu_count == 8
    assert topology.interconnect == "pcie"
    assert topology.simulated

@pytest.mark.gpus(16)
def test_sixteen():
    pass

@pytest.mark.interconnect("nvlink")
def test_nvlink():
    pass

@pytest.mark.compute_capability(12, 0)
@pytest.mark.arch("sm120")
def test_blackwell(topology):
    assert topology.compute_capability == (12, 0)

@pytest.mark.compute_capability(13)
def test_future():
    pass

@pytest.mark.requires("surely_not_a_module_xyz")
def test_needs_module():
    pass

@pytest.mark.requires("json")
def test_has_json():
    pass

def test_fingerprint(topology):
    assert topology.fingerprint.slug == "8x-rtx-pro-6000-pcie"
"""


def test_simulated_box_collects_and_skips_by_markers(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_marked=MARKED_TESTS)
    result = run_moeperf("--strict-markers", "-rs", "--moeperf-topology", "8x-rtx-pro-6000-pcie")
    result.assert_outcomes(passed=4, skipped=4)
    result.stdout.fnmatch_lines_random([
        "*test_marked.py:*: requires 16 GPU(s), found 8 GPU(s) (NVIDIA RTX PRO 6000 Blackwell Server Edition)",
        "*requires a nvlink interconnect, found pcie*",
        "*requires compute capability >= 13.0, found 12.0*",
        "*requires importable module(s) surely_not_a_module_xyz, not installed*",
    ])
    result.stdout.fnmatch_lines(["moeperf: 8x-rtx-pro-6000-pcie (hash *), 8x NVIDIA RTX PRO 6000*interconnect pcie,"
                                 " simulated*"])


def test_gpu_markers_skip_without_gpus_on_a_cpu_topology(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    topo = pytester.path / "cpu.json"
    topo.write_text('{"schema": 1, "gpus": [], "links": [], "host": {"cpu_model": "Test CPU", "arch": "x86_64",'
                    ' "cores": 2, "memory_bytes": 25769803776}}')
    pytester.makepyfile(test_marked=MARKED_TESTS)
    result = run_moeperf("-rs", "--moeperf-topology", str(topo))
    result.assert_outcomes(passed=1, failed=1, skipped=6)  # fingerprint test fails: cpu slug
    result.stdout.fnmatch_lines(["*requires 8 GPU(s), found 0 GPU(s)*"])


def test_perf_record_on_a_simulated_topology_skips(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile("def test_t(perf):\n    perf.record('latency', 1.0, unit='us')\n")
    result = run_moeperf("-rs", "--moeperf-topology", "8x-rtx-pro-6000-pcie", "--moeperf-update")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(["*topology is simulated*measurements need the real devices*"])
    assert not (pytester.path / "baselines").exists()


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("not json", "not valid JSON"),
        ('{"schema": 1, "gpus": [{"name": "X"}]}', "gpus[0]: missing field 'compute_capability'"),
        ('{"schema": 1, "gpus": [{"name": "X", "compute_capability": [9, 0]},'
         ' {"name": "X", "compute_capability": [9, 0]}], "links": []}', "links missing for GPU pair(s) [(0, 1)]"),
        ('{"schema": 1, "gpus": [{"name": "X", "compute_capability": [9, 0]}, {"name": "X",'
         ' "compute_capability": [9, 0]}], "links": [{"a": 0, "b": 1, "kind": "WIRE"}]}', "kind 'WIRE' is not one of"),
        ('{"schema": 7, "gpus": []}', "schema 7 is not supported"),
    ],
)
def test_bad_topology_file_is_a_usage_error(pytester: pytest.Pytester, run_moeperf, content: str,  # type: ignore[no-untyped-def]
                                            message: str) -> None:
    bad = pytester.path / "bad.json"
    bad.write_text(content)
    pytester.makepyfile("def test_t():\n    pass\n")
    result = run_moeperf("--moeperf-topology", str(bad))
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    err = result.stderr.str()
    assert "--moeperf-topology: " in err and "bad.json" in err and message in err, err


def test_missing_topology_file_names_the_bundled_ones(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile("def test_t():\n    pass\n")
    result = run_moeperf("--moeperf-topology", "no-such-box")
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    result.stderr.fnmatch_lines(["*'no-such-box' not found (bundled names: 2x-h200-nvlink, 8x-rtx-pro-6000-pcie*"])


DEADLINE_TESTS = """
import time
import pytest
from pytest_moeperf.runtime import skip_past_deadline

SHARED = {}

# Marked so that it always runs: on a loaded box the 1 s deadline (counted from configure) can pass before the
# first test starts. It does not check the deadline itself, as the test that measured for both had started.
@pytest.mark.moeperf_deadline_inside
def test_a_measures_for_both(perf):
    time.sleep(1.2)  # the deadline has passed by the end of the shared measurement, however soon it started
    SHARED["x"] = [1.0, 1.1, 1.0]
    perf.record("x", SHARED["x"], unit="us")

@pytest.mark.moeperf_deadline_inside
def test_b_reuses_it(request, perf):
    if "x" not in SHARED:
        skip_past_deadline(request.config)
    perf.record("x_again", SHARED["x"], unit="us")

@pytest.mark.moeperf_deadline_inside
def test_c_would_start_new_work(request, perf):
    skip_past_deadline(request.config)
    perf.record("y", [1.0], unit="us")

def test_d_plain(perf):
    perf.record("z", [1.0], unit="us")
"""


def test_deadline_lets_a_test_reuse_finished_work_and_skips_new_work(run_moeperf, pytester: pytest.Pytester) -> None:
    """Seen on 1x H200: the spec-decode pair for every concurrency was measured by the c=1 test, and the c=8 / c=32
    tests that only report it were skipped by --moeperf-deadline."""
    pytester.makepyfile(test_deadline=DEADLINE_TESTS)
    result = run_moeperf("--moeperf-deadline", "1", "-rs", "--moeperf-update")
    result.assert_outcomes(passed=2, skipped=2)
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] test_deadline.py:*: --moeperf-deadline 1 s passed*"])  # test_c
    result.stdout.fnmatch_lines(["SKIPPED [[]1[]] *runtime.py:*: --moeperf-deadline 1 s passed*"])  # test_d
    result.stdout.fnmatch_lines(["*test_b_reuses_it::x_again*NEW"])


BAD_REQUIREMENT_MARKERS = """
import pytest

@pytest.mark.requires(42)
def test_requires_a_number():
    pass

@pytest.mark.requires()
def test_requires_nothing():
    pass

@pytest.mark.requires("not a module")
def test_requires_a_sentence():
    pass

@pytest.mark.gpus(-1)
def test_negative_gpus():
    pass

@pytest.mark.compute_capability(-9)
def test_negative_capability():
    pass

@pytest.mark.requires("surely_not_a_package_xyz.sub")
def test_missing_parent_package():
    pass

@pytest.mark.requires("json.surely_not_a_submodule_xyz")
def test_missing_submodule():
    pass

@pytest.mark.requires("json.decoder")
def test_present_submodule():
    pass

@pytest.mark.requires("broken_pkg_xyz.sub")
def test_broken_parent_package():
    pass
"""


def test_bad_requirement_arguments_error_that_test_and_a_missing_parent_package_skips(  # type: ignore[no-untyped-def]
        pytester: pytest.Pytester, run_moeperf) -> None:
    """`requires(42)` and `requires("pkg.sub")` with `pkg` missing were an INTERNALERROR of the whole session, and
    `gpus(-1)` was accepted (issue 22, item 6)."""
    pytester.makepyfile(test_bad_req=BAD_REQUIREMENT_MARKERS)
    pytester.mkpydir("broken_pkg_xyz").joinpath("__init__.py").write_text("raise RuntimeError('half installed')\n")
    pytester.syspathinsert()
    result = run_moeperf("-rs", "--moeperf-topology", "8x-rtx-pro-6000-pcie")
    assert "INTERNALERROR" not in result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1, skipped=2, errors=6)
    assert result.ret == pytest.ExitCode.TESTS_FAILED
    result.stdout.fnmatch_lines_random([
        "*test_requires_a_number: bad marker: requires: a module name must be a string, got 42*",
        "*test_requires_nothing: bad marker: requires: name at least one module*",
        "*test_requires_a_sentence: bad marker: requires: 'not a module' is not a module name*",
        "*test_negative_gpus: bad marker: gpus: n (the number of GPUs) must be >= 0, got -1*",
        "*test_negative_capability: bad marker: compute_capability: major must be >= 0, got -9*",
        "*requires importable module(s) surely_not_a_package_xyz.sub, not installed*",
        "*requires importable module(s) json.surely_not_a_submodule_xyz, not installed*",
        "*test_broken_parent_package: requires('broken_pkg_xyz.sub'): importing its parent package raised"
        " RuntimeError: half installed*",
    ])
