"""The ``moeperf`` command, run as a user runs it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pytest_moeperf.machine import probe, topology


def moeperf(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pytest_moeperf.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=120)


def test_topology_prints_this_machine_and_its_fingerprint() -> None:
    done = moeperf("topology")
    assert done.returncode == 0, done.stderr
    assert f"fingerprint: {probe.probe().fingerprint.slug}" in done.stdout


def test_topology_json_is_what_the_plugin_reads_back(tmp_path: Path) -> None:
    out = tmp_path / "box.json"
    done = moeperf("topology", "--topology", "8x-rtx-pro-6000-pcie", "--json", str(out))
    assert done.returncode == 0, done.stderr
    assert topology.load_topology(out).fingerprint.slug == "8x-rtx-pro-6000-pcie"
    table = moeperf("topology", "--topology", str(out)).stdout
    assert "GPU7" in table and "SYS" in table and "interconnect: pcie" in table


def test_topology_rejects_a_bad_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text("[]")
    done = moeperf("topology", "--topology", str(bad))
    assert done.returncode == 2 and "must hold a JSON object" in done.stderr


def test_baselines_diff_against_git_shows_the_update(tmp_path: Path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True)

    folder = tmp_path / "baselines" / "cpu-x"
    folder.mkdir(parents=True)

    def write(value: float) -> None:
        metric = {"test": "t.py::a", "name": "lat", "unit": "us", "better": "lower",
                  "summary": {"n": 1, "median": value, "mean": value, "min": value, "max": value, "stddev": 0.0,
                              "iqr": 0.0, "q1": value, "q3": value, "ci_low": value, "ci_high": value}}
        (folder / "test_s.json").write_text(json.dumps({"schema": 1, "metrics": {"t.py::a::lat": metric}}))

    git("init", "-q")
    git("config", "user.email", "t@t")
    git("config", "user.name", "t")
    write(10.0)
    git("add", ".")
    git("commit", "-qm", "base")
    write(12.5)
    done = moeperf("baselines", "diff", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert "| cpu-x/test_s | `a::lat` | changed | 10 | 12.5 | us | +25.0 % |" in done.stdout


def test_baselines_diff_names_a_missing_directory(tmp_path: Path) -> None:
    done = moeperf("baselines", "diff", "--baselines", str(tmp_path / "nope"), "--old", str(tmp_path))
    assert done.returncode == 2 and "does not exist" in done.stderr


@pytest.mark.parametrize("args", [[], ["frobnicate"]])
def test_unknown_command_is_a_usage_error(args: list[str]) -> None:
    assert moeperf(*args).returncode == 2


def test_baselines_merge_joins_the_runs_of_copies_updated_apart(tmp_path: Path) -> None:
    """Two runners (or two machines) start from one committed baseline and each append a run: the merge keeps
    the shared run once and both new ones, and refuses copies measured on another machine."""
    from pytest_moeperf.ledger import Measurement
    from pytest_moeperf.store import baselines, entries

    def update(root: Path, value: float, date: str, fp_hash: str = "abc") -> None:
        m = Measurement("suites/x/test_s.py::test_a", "time", (value, value), "us", "lower")
        baselines.BaselineStore(root, "box").update([m], {"slug": "box", "hash": fp_hash}, {"date": date})

    main, left, right = tmp_path / "main", tmp_path / "left", tmp_path / "right"
    update(main, 10.0, "2026-12-01T01:00:00")
    for copy in (left, right):
        (copy / "box").mkdir(parents=True)
        (copy / "box" / "test_s.json").write_text((main / "box" / "test_s.json").read_text())
    update(left, 11.0, "2026-12-01T02:00:00")
    update(right, 12.0, "2026-12-01T03:00:00")
    done = moeperf("baselines", "merge", str(left), str(right), "--into", str(main))
    assert done.returncode == 0, done.stderr
    entry = baselines.read_file(main / "box" / "test_s.json").entries["suites/x/test_s.py::test_a::time"]
    assert [r.median for r in entry.all_runs] == [10.0, 11.0, 12.0]
    assert entry.summary.median == 12.0 and entry.reference().sittings == 3
    assert [r.median for r in entries.merge_entries(entry, entry, keep=2).all_runs] == [11.0, 12.0]

    other = tmp_path / "other"
    update(other, 50.0, "2026-12-01T04:00:00", fp_hash="def")
    refused = moeperf("baselines", "merge", str(other), "--into", str(main))
    assert refused.returncode == 2 and "fingerprint def differs from abc" in refused.stderr
    assert baselines.read_file(main / "box" / "test_s.json").entries[entry.key].summary.median == 12.0
