"""Metric keys follow the test file's project root, not pytest's rootdir (issue 30, item 1).

With no pytest configuration file, an option's value spelled with a space that names an existing path outside the
checkout (``--moeperf-baselines ../bl``) moves pytest's rootdir and so every node id: the keys must not move with
it, in a plain session, a ``--moeperf-rounds`` session with its extra rounds, and under xdist.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from pytest_moeperf.processes.children import ONLY_ENV
from pytest_moeperf.store.keys import TestIds, project_root

SYN = """
import os, pytest

def test_a(perf):
    perf.record("time", [100.0 * float(os.environ.get("MULT", "1"))] * 20, unit="us")

def test_b(perf):
    if os.environ.get("SKIP_B"):
        pytest.skip("asked to")
    perf.record("time", [50.0 * float(os.environ.get("MULT", "1"))] * 20, unit="us")
"""
KEYS = ["test_syn.py::test_a::time", "test_syn.py::test_b::time"]


@pytest.fixture
def proj(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A project without any configuration file in ``proj/``, its baselines in ``../bl`` (outside it), three
    runs recorded (the option spelled with '=': pytest's rootdir is ``proj/``); the sessions start in ``proj/``."""
    root = pytester.path / "proj"
    root.mkdir()
    (root / "test_syn.py").write_text(SYN)
    monkeypatch.chdir(root)
    for _ in range(3):
        assert session(pytester, "--moeperf-update", baselines=("--moeperf-baselines=../bl",)).ret == 0
    assert stored_keys(pytester) == KEYS
    return root


def stored_keys(pytester: pytest.Pytester) -> list[str]:
    slug = next((pytester.path / "bl").iterdir())
    return sorted(json.loads((slug / "test_syn.json").read_text())["metrics"])


def session(pytester: pytest.Pytester, *args: str, baselines: tuple[str, ...] = ("--moeperf-baselines", "../bl")
            ) -> pytest.RunResult:
    """A session in the current directory, the baselines option spelled as the user would (with a space)."""
    return pytester.runpytest("test_syn.py", "-p", "no:cacheprovider", "--moeperf-health", "off",
                              "--moeperf-canary", "off",
                              "--moeperf-history", "off", *baselines, *args)


def test_an_update_with_the_baselines_spelled_with_a_space_keeps_the_keys(pytester: pytest.Pytester,
                                                                         proj: Path) -> None:
    assert session(pytester, "--moeperf-update").ret == pytest.ExitCode.OK
    assert stored_keys(pytester) == KEYS


def test_a_tenfold_run_with_the_baselines_spelled_with_a_space_regresses(pytester: pytest.Pytester, proj: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULT", "10")
    result = session(pytester, "--moeperf-strict")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["test_syn.py::test_a::time * REGRESSED", "test_syn.py::test_b::time * REGRESSED"])
    assert "NEW" not in result.stdout.str()


def test_a_markdown_summary_outside_the_checkout_moves_no_key(pytester: pytest.Pytester, proj: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's own ``--moeperf-markdown "$GITHUB_STEP_SUMMARY"``: an existing file outside the project."""
    summary = pytester.path / "step_summary.md"
    summary.write_text("")
    monkeypatch.setenv("MULT", "10")
    result = session(pytester, "--moeperf-markdown", str(summary), baselines=("--moeperf-baselines=../bl",))
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    assert "test_syn.py::test_a::time" in summary.read_text() and "proj/test_syn.py" not in summary.read_text()


def test_rounds_children_and_their_extra_rounds_use_the_same_keys(pytester: pytest.Pytester, proj: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MULT", "10")
    result = session(pytester, "--moeperf-rounds", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["test_syn.py::test_a::time * REGRESSED"])
    # an extra round's file of tests names them as the metric keys do: the child runs exactly those
    only = pytester.path / "only.txt"
    only.write_text("test_syn.py::test_b\n")
    monkeypatch.setenv(ONLY_ENV, str(only))
    monkeypatch.delenv("MULT")
    extra = session(pytester)
    extra.assert_outcomes(passed=1, deselected=1)
    extra.stdout.fnmatch_lines(["test_syn.py::test_b::time * PASS"])


def test_xdist_workers_and_missing_metrics_use_the_same_keys(pytester: pytest.Pytester, proj: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("xdist")
    monkeypatch.setenv("MULT", "10")
    monkeypatch.setenv("SKIP_B", "1")
    result = session(pytester, "-n", "2")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["test_syn.py::test_a::time * REGRESSED", "test_syn.py::test_b::time * MISSING"])


def test_stored_metrics_that_match_nothing_that_ran_are_named_and_fail_under_strict(
        pytester: pytest.Pytester, proj: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The test file moved (``sub/test_syn.py``): its baseline file holds only the old paths' metrics."""
    (proj / "sub").mkdir()
    (proj / "test_syn.py").rename(proj / "sub" / "test_syn.py")
    monkeypatch.chdir(proj / "sub")
    (proj / "pytest.ini").write_text("[pytest]\n")  # the project root is proj/: keys are sub/test_syn.py::…
    result = session(pytester, baselines=("--moeperf-baselines", "../../bl"))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["moeperf: */test_syn.json holds 2 metric(s) of test_syn.py and none of "
                                 "sub/test_syn.py, which this session measured: none matches, every metric is NEW*"])
    strict = session(pytester, "--moeperf-strict", baselines=("--moeperf-baselines", "../../bl"))
    assert strict.ret == pytest.ExitCode.TESTS_FAILED


def test_a_new_test_beside_stored_ones_is_not_warned_about(pytester: pytest.Pytester, proj: Path) -> None:
    (proj / "test_syn.py").write_text(SYN + "\ndef test_c(perf):\n    perf.record('time', [1.0] * 5, unit='us')\n")
    result = session(pytester, "-k", "test_c", "--moeperf-strict")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert "none matches" not in result.stdout.str()


# ------------------------------------------------------------------------------------------ the rule
def test_the_project_root_is_found_from_the_files_own_location(tmp_path: Path) -> None:
    top = tmp_path / "repo"
    deep = top / "a" / "b"
    deep.mkdir(parents=True)
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    assert project_root(deep, invocation_dir=top) == top  # nothing marks a root: the start directory above it
    assert project_root(deep, invocation_dir=elsewhere) == deep  # ... or the file's own directory
    subprocess.run(["git", "init", "-q", str(top)], check=True)
    assert project_root(deep, elsewhere) == top  # the git work tree's top
    (top / "a" / "setup.py").write_text("")
    assert project_root(deep, elsewhere) == top / "a"
    (deep / "pyproject.toml").write_text("[project]\nname = 'x'\n")  # no pytest table: a fallback only
    assert project_root(deep, elsewhere) == deep
    (top / "a" / "tox.ini").write_text("[tox]\n")  # no [pytest] section: not pytest's
    assert project_root(deep, elsewhere) == deep
    (top / "pyproject.toml").write_text("[tool.pytest.ini_options]\naddopts = ''\n")
    assert project_root(deep, elsewhere) == top  # a pytest configuration above wins over a bare pyproject.toml
    (top / "a" / "tox.ini").write_text("[pytest]\n")
    assert project_root(deep, elsewhere) == top / "a"


def test_test_ids_do_not_depend_on_the_rootdir(tmp_path: Path) -> None:
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    test = tmp_path / "suites" / "x" / "test_x.py"
    for rootdir, nodeid in ((tmp_path.parent, f"{tmp_path.name}/suites/x/test_x.py::test_y[a::b]"),
                            (tmp_path / "suites", "x/test_x.py::test_y[a::b]")):
        ids = TestIds(rootdir, invocation_dir=tmp_path.parent)
        assert ids.of_path(test, nodeid) == "suites/x/test_x.py::test_y[a::b]"
        assert ids.of_nodeid(nodeid) == "suites/x/test_x.py::test_y[a::b]"


def test_the_committed_baselines_keep_their_keys() -> None:
    """The repository's suites are keyed relative to its top (its pyproject.toml), from wherever pytest runs."""
    repo = Path(__file__).parents[2]
    stored = {key.split("::", 1)[0] for path in (repo / "baselines").glob("*/*.json")
              for key in json.loads(path.read_text())["metrics"]}
    assert stored and all((repo / path).is_file() for path in stored), stored
    ids = TestIds(Path("/"), invocation_dir=Path("/"))
    for path in stored:
        assert ids.of_path(repo / path, f"elsewhere/{Path(path).name}::test_t") == f"{path}::test_t"
