"""Profiles are data: the suites parametrize over the profile files of ``--moeperf-profiles`` (or its ini twin), a
user's own file yields tests, and a workload longer than a profile's ``max_model_len`` is an error at collection
naming both numbers (pytester sessions of the real suites, collection only: no server is started)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PROFILES = REPO / "suites" / "serving" / "profiles"


def _suites(pytester: pytest.Pytester) -> None:
    for suite in ("serving", "specdecode"):
        shutil.copytree(REPO / "suites" / suite, pytester.path / "suites" / suite,
                        ignore=shutil.ignore_patterns("profiles", "__pycache__"))  # fmt: skip


def _user_profile(directory: Path, name: str, **fields: object) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    body = {"name": name, "model": "/models/my-moe", "device": "cuda", "tp": 2, "max_model_len": 4096, **fields}
    (directory / f"{name}.json").write_text(json.dumps(body))


def test_a_user_profile_in_a_configured_dir_is_collected(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    _suites(pytester)
    mine = pytester.path / "my-profiles"
    _user_profile(mine, "my-moe-tp2")
    _user_profile(mine, "my-moe-tp2-ngram", reference="my-moe-tp2",
                  speculative={"method": "ngram", "num_speculative_tokens": 3})  # fmt: skip
    result = run_moeperf("suites", "--collect-only", "-q", "--moeperf-profiles", str(mine))
    result.stdout.fnmatch_lines([
        "*test_serving.py::test_closed_loop?my-moe-tp2-c16?",
        "*test_serving.py::test_chat_closed_loop?my-moe-tp2?",
        "*test_specdecode.py::test_decode?my-moe-tp2-ngram-c16?",
        "*test_specdecode.py::test_speedup?my-moe-tp2-ngram-c16?",
    ])  # fmt: skip
    assert "cpu-tiny" not in result.stdout.str()  # only the configured directory
    assert "test_closed_loop[my-moe-tp2-ngram" not in result.stdout.str()  # speculating: the spec-decode suite's


def test_the_ini_twin_takes_several_dirs_with_the_bundled_one(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    _suites(pytester)
    shutil.copytree(PROFILES, pytester.path / "suites" / "serving" / "profiles")
    _user_profile(pytester.path / "extra", "my-moe-tp2")
    pytester.makeini("[pytest]\nmoeperf_profiles =\n    suites/serving/profiles\n    extra\n")
    result = run_moeperf("suites/serving", "--collect-only", "-q")
    result.stdout.fnmatch_lines(["*test_closed_loop?cpu-tiny-nospec-c1?", "*test_closed_loop?my-moe-tp2-c1?"])


def test_a_workload_longer_than_max_model_len_is_an_error_naming_both(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    _suites(pytester)
    mine = pytester.path / "my-profiles"
    _user_profile(mine, "short-context", max_model_len=1024)  # the first H200 run: 1024 + 256 sent to 1024
    result = run_moeperf("suites/serving", "--collect-only", "-q", "--moeperf-profiles", str(mine))
    assert result.ret != 0
    # the longest request: 128 output tokens spread up to +25 % in the GPU closed loops
    result.stdout.fnmatch_lines(["*1024 input + 160 output = 1184 tokens exceed profile 'short-context'*"
                                 "max_model_len 1024*"])  # fmt: skip


def test_bundled_gpu_profiles_fit_their_workloads(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    _suites(pytester)
    result = run_moeperf("suites", "--collect-only", "-q", "--moeperf-profiles", str(PROFILES))
    assert result.ret == 0, result.stdout.str()
    for name in (
        "gpu-tiny-tp1-nospec-c16",
        "gpu-tiny-tp2-nospec-c1",
        "gpu-tiny-tp1-eagle3-c1",
        "gpu-tiny-tp2-draft-c16",
    ):
        assert name in result.stdout.str(), name


def test_a_missing_profiles_dir_is_a_usage_error(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    _suites(pytester)
    result = run_moeperf("suites/serving", "--collect-only", "--moeperf-profiles", "nowhere")
    assert result.ret != 0
    assert "profiles directory" in result.stdout.str() + result.stderr.str()


def test_tests_of_profiles_this_host_cannot_launch_are_no_starts(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    """A GPU profile on this CPU box skips: its tests are not run in child sessions of their own (no start to
    measure), they skip here, once."""
    _suites(pytester)
    result = run_moeperf("suites/serving", "--moeperf-profiles", str(PROFILES), "-k", "gpu-tiny-tp1-nospec",
                         "--moeperf-starts", "2", "-rs")
    assert "measure a start" not in result.stdout.str()
    result.stdout.fnmatch_lines(["*needs 1 GPUs (TP=1); found 0*"])
    assert result.parseoutcomes().get("skipped", 0) >= 5
