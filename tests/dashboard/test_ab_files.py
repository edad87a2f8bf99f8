"""``moeperf dashboard --ab``'s files: only regular files of at most 64 MiB (`abresults.MAX_BYTES`) are read, and
every file passed over is named with why. A FIFO named ``*.json`` hung the build forever, a symlink to
``/dev/zero`` read without bound, and a folder with no A/B report was passed over silently: the commands run in a
child process with a time and memory limit, so that a build that hangs or reads without bound fails the test instead
of the box."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from pytest_moeperf.dashboard.model import page_of
from tests.dashboard.histories import GEMM, fill
from tests.dashboard.test_build import payload

LIMIT_S = 60
MEMORY = 2 * 2**30  # address space of the child: a read without bound stops there
BOUND = 64 * 2**20  # abresults.MAX_BYTES, as the messages state it


def _bounded() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def dashboard(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GITHUB_")}
    env["OPENBLAS_NUM_THREADS"] = "1"  # its per-thread buffers would count against MEMORY
    return subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", "dashboard", "--jobs", "1", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=LIMIT_S, preexec_fn=_bounded)


def ab_report(commit: str) -> dict[str, object]:
    key = GEMM.format(1)
    return {"commit_info": {"id": commit},
            "benchmarks": [{"fullname": key, "extra_info": {"verdict": "PASS", "change": 0.004}}],
            "moeperf": {"hash": "0123456789ab", "ab": {"sides": {"base": {"ref": "main"}, "head": {}},
                                                       "metrics": {key: {"pairs": 9, "p": 0.6}}}}}


def test_a_folder_passes_over_what_is_not_a_regular_report_and_says_why(tmp_path: Path) -> None:
    fill(str(tmp_path / "h.sqlite"), sessions=4)
    folder = tmp_path / "ab"
    folder.mkdir()
    (folder / "good.json").write_text(json.dumps(ab_report("0002" + "c0ffee" * 6)))
    os.mkfifo(folder / "fifo.json")
    (folder / "zero.json").symlink_to("/dev/zero")
    with (folder / "huge.json").open("wb") as f:  # sparse: no disk used
        f.truncate(BOUND + 1)
    (folder / "plain.json").write_text('{"benchmarks": []}')
    (folder / "gone.json").symlink_to(tmp_path / "nowhere.json")
    (folder / "folder.json").mkdir()
    done = dashboard("--db", "h.sqlite", "--out", "site", "--ab", "ab", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert ("--ab ab: 1 A/B report(s) among 7 *.json file(s); passed over: fifo.json (not a regular file: a FIFO), "
            "folder.json (not a regular file: a folder), gone.json (cannot read it: No such file or directory), "
            "huge.json (larger than 64 MiB, the most an A/B report is read to), plain.json (not a moeperf ab report "
            "(no moeperf.ab section)), zero.json (not a regular file: a character device)") in done.stderr
    assert "A/B reports: 1 read, 1 beside a session shown" in done.stderr
    [row] = payload(tmp_path / "site" / page_of(GEMM.format(1)))["ab"]
    assert (row["s"], row["report"], row["status"]) == (3, "good.json", "PASS")


def test_a_folder_with_no_ab_report_says_so(tmp_path: Path) -> None:
    fill(str(tmp_path / "h.sqlite"), sessions=4)
    (tmp_path / "empty").mkdir()
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / "session.json").write_text('{"benchmarks": [], "moeperf": {}}')
    done = dashboard("--db", "h.sqlite", "--out", "site", "--ab", "empty", "--ab", "reports", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "--ab empty: no *.json file in it" in done.stderr
    assert ("--ab reports: no moeperf ab report among its 1 *.json file(s); passed over: session.json (not a moeperf "
            "ab report (no moeperf.ab section))") in done.stderr
    assert "A/B reports: 0 read, 0 beside a session shown" in done.stderr


def test_a_named_file_that_is_no_regular_report_is_refused_without_reading_it(tmp_path: Path) -> None:
    fill(str(tmp_path / "h.sqlite"), sessions=4)
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "zero.json").symlink_to("/dev/zero")
    with (tmp_path / "huge.json").open("wb") as f:
        f.truncate(BOUND + 1)
    (tmp_path / "bad.json").write_text('{"moeperf": {"ab": {"sides": {"head": "main"}}}}')
    for name, why in (("zero.json", "not a regular file: a character device"), ("fifo.json", "not a regular file: "
                      "a FIFO"), ("huge.json", "larger than 64 MiB"), ("bad.json", "a malformed moeperf ab report")):
        done = dashboard("--db", "h.sqlite", "--out", "site", "--ab", name, cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert f"moeperf dashboard: --ab {name}: {why}" in done.stderr and "nothing written to site" in done.stderr
        assert not (tmp_path / "site").exists()
