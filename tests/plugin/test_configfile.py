"""A path option written with a space must not move the project's configuration (issue 37, item 1).

pytest finds its rootdir and configuration file before it loads our plugin, so the value of ``--moeperf-markdown
../runner/step_summary`` reads as a test path; an existing one outside the project moved the rootdir, the default
baselines folder (relative to the ini file) and the ini settings (``moeperf_strict``) with it: every metric NEW,
exit 0, where ``--moeperf-markdown=PATH`` read REGRESSED, exit 1. The README recommends the spaced form with
``$GITHUB_STEP_SUMMARY``, a file outside the checkout on every runner.
"""

from __future__ import annotations

from pathlib import Path

import pytest

TEST = """
import os

def test_p(perf):
    if os.environ.get("SKIP_T"):
        return
    f = float(os.environ.get("F", "1"))
    perf.record("t", [f * v for v in (1.0, 1.01, 0.99, 1.0, 1.02)], unit="ms")
"""
CONFIG = "[tool.pytest.ini_options]\nmoeperf_strict = true\n"


@pytest.fixture
def proj(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The issue's project: strict in its pyproject.toml, baselines in its default folder (three runs at F=1),
    sessions started in it; beside it ``runner/`` holds an existing summary file, history database, report, HTML
    report and a folder, as a CI runner does."""
    root = pytester.path / "proj"
    root.mkdir()
    (root / "pyproject.toml").write_text(CONFIG)
    (root / "test_p.py").write_text(TEST)
    runner = pytester.path / "runner"
    (runner / "profiles").mkdir(parents=True)
    for name in ("step_summary", "report.json", "report.html", "history.sqlite"):
        (runner / name).write_text("")
    monkeypatch.chdir(root)
    for _ in range(3):
        assert session(pytester, "--moeperf-update").ret == pytest.ExitCode.OK
    assert [p.name for p in (root / "baselines").iterdir()]  # the default folder: beside pyproject.toml
    return root


def session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    """A session in the current directory, with no test path: pytest's rootdir comes from its arguments alone. The
    canary is off, as in `run_moeperf`: these sessions test where settings come from, and a canary that moved in one
    of them (+46 % beside a x2, seen on the 2-vCPU AMD VM) makes its x2 INCONCLUSIVE, cause machine, by design."""
    return pytester.runpytest("-p", "no:cacheprovider", "--moeperf-health=off", "--moeperf-canary=off", *args)


PATH_OPTIONS = [("--moeperf-markdown", "step_summary"), ("--moeperf-report", "report.json"),
                ("--moeperf-html", "report.html"), ("--moeperf-history", "history.sqlite"),
                ("--moeperf-profiles", "profiles")]


@pytest.mark.parametrize(("option", "name"), PATH_OPTIONS)
def test_a_path_option_gives_the_same_verdicts_whichever_way_it_is_written(
        pytester: pytest.Pytester, proj: Path, monkeypatch: pytest.MonkeyPatch, option: str, name: str) -> None:
    value = "../runner/" + name
    history = () if option == "--moeperf-history" else ("--moeperf-history=off",)
    monkeypatch.setenv("F", "2")
    joined = session(pytester, f"{option}={value}", *history)
    spaced = session(pytester, option, value, *history)
    for result in (joined, spaced):
        assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
        result.stdout.fnmatch_lines(["test_p.py::test_p::t * REGRESSED"])
        assert "NEW" not in result.stdout.str()
    config = proj / "pyproject.toml"
    spaced.stdout.fnmatch_lines([f"pytest took '{option} {value}' for a test path: it read no configuration file "
                                 f"instead of {config}; the moeperf_* settings were read from {config}; its rootdir*"])
    assert "INCONCLUSIVE or MISSING and 1 warning" not in spaced.stdout.str()  # a note: nothing of pytest's lost


def test_the_readme_form_with_github_step_summary_outside_the_checkout(pytester: pytest.Pytester, proj: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``--moeperf-markdown "$GITHUB_STEP_SUMMARY"``: an absolute path elsewhere, which already exists."""
    summary = pytester.path / "runner" / "step_summary"
    monkeypatch.setenv("F", "2")
    result = session(pytester, "--moeperf-markdown", str(summary), "--moeperf-history=off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["test_p.py::test_p::t * REGRESSED"])
    assert "REGRESSED" in summary.read_text()


def test_strict_from_the_project_configuration_holds_whichever_way(pytester: pytest.Pytester, proj: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A metric the test did not record is MISSING, which ``moeperf_strict = true`` fails: in both spellings (the
    spaced one read no configuration file: strict was lost, and the baselines with it)."""
    monkeypatch.setenv("SKIP_T", "1")
    for args in (["--moeperf-markdown=../runner/step_summary"], ["--moeperf-markdown", "../runner/step_summary"]):
        result = session(pytester, *args, "--moeperf-history=off")
        assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
        result.stdout.fnmatch_lines(["test_p.py::test_p::t * MISSING", "*--moeperf-strict*the session fails*"])


def test_pytest_settings_that_could_not_be_applied_are_a_warning_strict_fails(
        pytester: pytest.Pytester, proj: Path) -> None:
    """The project's configuration also holds pytest's own settings (markers, addopts), which only pytest reads:
    the spaced run cannot apply them, says so, and strict fails it even though its verdicts pass."""
    (proj / "pyproject.toml").write_text(CONFIG + 'markers = ["slow: slow tests"]\naddopts = "-ra"\n')
    assert session(pytester, "--moeperf-markdown=../runner/step_summary", "--moeperf-history=off").ret == 0
    result = session(pytester, "--moeperf-markdown", "../runner/step_summary", "--moeperf-history=off")
    assert result.ret == pytest.ExitCode.TESTS_FAILED, result.stdout.str()
    result.stdout.fnmatch_lines(["test_p.py::test_p::t * PASS",
                                 "moeperf: pytest took '--moeperf-markdown ../runner/step_summary' for a test path*"
                                 "but pytest's own there (addopts, markers) were not applied*write an option and its "
                                 "value as one argument*",
                                 "*1 warning(s): the session fails"])
    (proj / "pyproject.toml").write_text(CONFIG.replace("true", "false") + 'markers = ["slow: slow tests"]\n')
    assert session(pytester, "--moeperf-markdown", "../runner/step_summary", "--moeperf-history=off").ret == 0


def test_only_a_moved_rootdir_is_a_note(pytester: pytest.Pytester, proj: Path) -> None:
    """No configuration file at all: the spaced value moves only the rootdir (node ids, pytest's cache); the
    baselines and the verdicts stay, and the session says so in a note, which strict does not fail."""
    (proj / "pyproject.toml").unlink()
    (proj / "pytest.ini").write_text("[pytest]\n")
    for _ in range(3):  # the ini file's folder is proj/ as before: the same baselines
        assert session(pytester, "--moeperf-history=off").ret == 0
    (proj / "pytest.ini").unlink()
    result = session(pytester, "--moeperf-markdown", "../runner/step_summary", "--moeperf-history=off",
                     "--moeperf-strict")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    result.stdout.fnmatch_lines(["test_p.py::test_p::t * PASS",
                                 f"*its rootdir is {pytester.path}, not {proj} (node ids and pytest's cache follow*"])
