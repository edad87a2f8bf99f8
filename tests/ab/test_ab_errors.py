"""Bad input to ``moeperf ab``: exit status 2 and one line naming the option, before any side runs."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from pytest_moeperf.cli import main


def failed(capsys: pytest.CaptureFixture[str], *args: str) -> str:
    """``moeperf ab ARGS`` in-process: exit status 2; stderr's last line."""
    try:
        rc = main(["ab", *args])
    except SystemExit as exc:
        rc = int(exc.code or 0)
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert rc == 2, err
    return (err.strip().splitlines() or [""])[-1]


@pytest.mark.parametrize(("args", "message"), [
    (["--", "suites", "--moeperf-update"], "pytest argument --moeperf-update: the sides must not update baselines"),
    (["--", "--moeperf-rounds=3"], "pytest argument --moeperf-rounds: a side's process is the unit"),
    (["--", "--moeperf-history", "x.sqlite"], "pytest argument --moeperf-history: the sides write no history"),
    (["--", "--moeperf-report", "x.json"], "use moeperf ab --report"),
    (["--pairs", "8", "--max-pairs", "6"], "--max-pairs 6 is below --pairs 8"),
    (["--pairs", "4", "--max-pairs", "4"],
     "--max-pairs 4: the signed-rank test needs at least 6 pairs to decide at --alpha 0.05 over 1 look(s) "
     "(0.05 a look)"),
    (["--pairs", "6", "--max-pairs", "6", "--alpha", "0.01"], "needs at least 8 pairs to decide at --alpha 0.01"),
    (["--pairs", "3", "--max-pairs", "6"], "needs at least 7 pairs to decide at --alpha 0.05 over 2 look(s) (0.025 a"),
    (["--aa", "--head-env", "X=1"], "--aa runs the base side twice: --head-env does not apply"),
    (["--base-env", "NOVALUE"], "argument --base-env: expected KEY=VALUE with KEY a variable name, got 'NOVALUE'"),
    (["--head-env", "1X=2"], "argument --head-env: expected KEY=VALUE"),
    (["--base-python", "/no/such/python"], "argument --base-python: /no/such/python: no such interpreter"),
    (["--pairs", "0"], "argument --pairs: must be at least 1, got 0"),
    (["--alpha", "2"], "argument --alpha: must be a probability in (0, 1], got 2"),
    (["--serve", "cpu-tiny-nospec", "--", "suites/serving", "--moeperf-server-url", "http://127.0.0.1:1"],
     "pytest argument --moeperf-server-url: --serve gives each side its own server"),
    (["--serve-reuse"], "--serve-reuse is about the servers of --serve: name a profile with --serve PROFILE"),
    (["--serve", "p", "--serve-reuse", "--serve-fresh"], "argument --serve-fresh: not allowed with argument "
                                                         "--serve-reuse"),
])
def test_bad_options(capsys: pytest.CaptureFixture[str], args: list[str], message: str) -> None:
    assert message in failed(capsys, *args)


def test_a_folder_that_is_not_a_virtual_environment(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert "is a directory without bin/python" in failed(capsys, "--head-python", str(tmp_path))


def test_an_output_path_that_is_a_folder(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert f"argument --report: {tmp_path} is a directory" in failed(capsys, "--report", str(tmp_path))


def test_a_revision_that_is_no_commit(capsys: pytest.CaptureFixture[str], tmp_path: Path,
                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert failed(capsys, "--base-ref", "main").endswith(f"--base-ref main: {tmp_path} is not inside a git checkout")
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    line = failed(capsys, "--head-ref", "no-such-branch")
    assert line == f"moeperf ab: --head-ref no-such-branch: not a commit of the git checkout {tmp_path.resolve()}"


def test_an_interpreter_that_cannot_run_pytest(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho 'No module named pytest' >&2\nexit 1\n")
    fake.chmod(0o755)
    line = failed(capsys, "--base-python", str(fake))
    assert line.startswith(f"moeperf ab: --base-python {fake} cannot import pytest and pytest_moeperf in ")
    assert line.endswith("No module named pytest")
