"""A perf history of the four real suites, for the dashboard's build and browser tests.

* **GPU** (serving and spec decode): every moeperf JSON report in the archives committed under
  ``docs/measurements/raw/`` (``moeperf batch``'s ``serving.json`` of the 1x H200 sittings, and the Kimi rank's
  starts), as the sessions wrote them: 14 sessions on 4 hosts, ``failed_rate`` 0 in every one, start-up phases of
  0 s in some.
* **CPU** (GEMM and all-reduce): two real sessions of a few cases run here (``CPU_CASES``, ``--moeperf-quick``, no
  confirmation re-runs; about 15 s each on an idle 2-core box, 30-45 s at load 7), the first with
  ``--moeperf-update`` into a scratch baselines folder, the second judged against it.

Each session goes through the real history store: the GPU reports by `records_from_report` and `HistoryStore.append`
(what ``--moeperf-history`` does at a session's end), the CPU ones by ``--moeperf-history`` itself."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

from pytest_moeperf.history.records import records_from_report
from pytest_moeperf.history.store import HistoryStore

ROOT = Path(__file__).resolve().parents[2]
RAW = ROOT / "docs" / "measurements" / "raw"
CPU_CASES = ("suites/gemm/test_gemm.py::test_gemm[kimi-k2.5-o_proj-m1-bf16]",
             "suites/gemm/test_gemm.py::test_gemm[kimi-k2.5-router-m1-bf16]",
             "suites/allreduce/test_allreduce.py::test_allreduce[gloo-decode-b1-14KiB]")


def gpu_reports() -> list[tuple[str, dict[str, Any]]]:
    """``(archive:member, document)`` of each report with metrics in the archives of `RAW`, oldest first."""
    found = []
    for archive in sorted(RAW.glob("*/*.tgz")):
        with tarfile.open(archive) as tar:
            for member in tar.getmembers():
                handle = tar.extractfile(member) if member.isfile() and member.name.endswith(".json") else None
                doc = json.load(handle) if handle is not None else None
                if isinstance(doc, dict) and doc.get("benchmarks"):
                    found.append((f"{archive.relative_to(ROOT)}:{member.name}", doc))
    return sorted(found, key=lambda item: str(item[1].get("datetime")))


def cpu_session(history: Path, baselines: Path, *options: str) -> str:
    """One real session of `CPU_CASES` appending to ``history``; its output."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MOEPERF_"))}
    done = subprocess.run([sys.executable, "-m", "pytest", *CPU_CASES, "-q", "-p", "no:cacheprovider",
                           "--moeperf-quick", "--moeperf-confirm", "0", "--moeperf-baselines", str(baselines),
                           "--moeperf-history", str(history), *options], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    # 1: a test failed, e.g. a verdict REGRESSED against the one stored run; the session is recorded all the same
    assert done.returncode in (0, 1) and "this run appended to" in done.stdout, done.stdout + done.stderr
    return done.stdout


def fill(history: Path, work: Path) -> int:
    """The history at ``history`` (a new SQLite file): the GPU reports, then two CPU sessions; its session count."""
    reports = gpu_reports()
    assert len(reports) >= 10, f"the raw GPU reports under {RAW} are gone: {[name for name, _ in reports]}"
    with HistoryStore.open(str(history)) as store:
        for _, doc in reports:
            store.append(*records_from_report(doc))
    cpu_session(history, work / "baselines", "--moeperf-update")
    cpu_session(history, work / "baselines")
    return len(reports) + 2
