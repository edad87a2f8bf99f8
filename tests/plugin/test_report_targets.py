"""Report files are written *to* what sits at their path, never instead of it (issue 30, item 7): through a symlink
to its target, into a FIFO or a character device in place, to this process's standard output through
``/dev/stdout``'s kind of link. Every target here is made in the test's own directory (a device node by ``mknod``
as root), so nothing of the machine's is at stake."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import pytest

LAT = "def test_lat(perf):\n    perf.record('latency', [100.0] * 20, unit='us')\n"


def _mode(path: Path) -> int:
    return os.lstat(path).st_mode


def test_a_report_through_a_symlink_replaces_its_target_and_keeps_the_link(pytester: pytest.Pytester,  # type: ignore[no-untyped-def]
                                                                            run_moeperf) -> None:
    pytester.makepyfile(test_h=LAT)
    (pytester.path / "kept").mkdir()
    (pytester.path / "kept" / "report.json").write_text("old")
    (pytester.path / "report.json").symlink_to("kept/report.json")
    (pytester.path / "later.md").symlink_to("kept/not-yet.md")  # a link whose target does not exist yet
    result = run_moeperf("--moeperf-history", "off", "--moeperf-report", "report.json", "--moeperf-html", "later.md")
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert stat.S_ISLNK(_mode(pytester.path / "report.json")) and stat.S_ISLNK(_mode(pytester.path / "later.md"))
    assert "records" in json.loads((pytester.path / "kept" / "report.json").read_text())["moeperf"]
    if "later.md" in result.stdout.str():  # the HTML report needs the history extra
        assert (pytester.path / "kept" / "not-yet.md").read_text().startswith("<!DOCTYPE html>")


def test_a_report_into_a_fifo_is_written_into_it(pytester: pytest.Pytester, run_moeperf) -> None:  # type: ignore[no-untyped-def]
    pytester.makepyfile(test_h=LAT)
    fifo = pytester.path / "pipe"
    os.mkfifo(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()  # blocks in open() until the session opens the FIFO to write
    result = run_moeperf("--moeperf-history", "off", "--moeperf-report", str(fifo))
    assert stat.S_ISFIFO(_mode(fifo)), "the FIFO was replaced"
    reader.join(30)
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert got and "records" in json.loads(got[0])["moeperf"]


@pytest.fixture
def device(tmp_path: Path):  # type: ignore[no-untyped-def]
    """``device(name, minor)``: a private character device node of the memory driver (major 1: 3 null, 7 full)."""

    def make(name: str, minor: int) -> Path:
        path = tmp_path / name
        try:
            os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, minor))
        except PermissionError:
            pytest.skip("mknod needs root (CAP_MKNOD)")
        return path

    return make


def test_a_character_device_is_written_in_place_never_replaced(pytester: pytest.Pytester, run_moeperf,  # type: ignore[no-untyped-def]
                                                               device) -> None:
    pytester.makepyfile(test_h=LAT)
    null, full = device("null", 3), device("full", 7)
    result = run_moeperf("--moeperf-history", "off", "--moeperf-report", str(null))
    assert result.ret == pytest.ExitCode.OK, result.stdout.str()
    assert stat.S_ISCHR(_mode(null)) and os.stat(null).st_rdev == os.makedev(1, 3)
    full_run = run_moeperf("--moeperf-history", "off", "--moeperf-report", str(full))
    assert stat.S_ISCHR(_mode(full)) and os.stat(full).st_rdev == os.makedev(1, 7)
    full_run.stdout.fnmatch_lines([f"moeperf: could not write {full}: *No space left on device*"])


def test_a_report_to_standard_output_goes_there(pytester: pytest.Pytester) -> None:
    """``--moeperf-report /dev/stdout``, with a link of its own kind (to ``/proc/self/fd/1``)."""
    pytester.makepyfile(test_h=LAT)
    stdout = pytester.path / "stdout"
    stdout.symlink_to("/proc/self/fd/1")
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--moeperf-health", "off",
                                           "--moeperf-canary", "off", "--moeperf-history",
                                           "off", "--moeperf-baselines", str(pytester.path / "baselines"),
                                           "--moeperf-report", str(stdout), "--moeperf-markdown", str(stdout))
    assert result.ret == pytest.ExitCode.OK, result.stderr.str()
    assert stat.S_ISLNK(_mode(stdout)) and os.readlink(stdout) == "/proc/self/fd/1"
    out = result.stdout.str()
    start = out.index("{\n")
    document = json.JSONDecoder().raw_decode(out[start:])[0]
    assert "records" in document["moeperf"]
    assert out.index("test_h.py .") < start < out.index("1 passed"), "the report is written in order, nothing lost"
    assert start < out.index("| `test_h.py::test_lat::latency` |") < out.index("1 passed"), out
