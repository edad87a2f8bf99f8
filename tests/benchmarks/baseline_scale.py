"""How a session scales with the size of a baseline file (issue 37, item 18): one test file whose baseline holds
100,000 metrics (~170 MB, as the issue's), judged and updated by real pytest sessions that measure a few of them.

    python tests/benchmarks/baseline_scale.py [--metrics 100000] [--judged 100] [--runs 3] [--dir DIR]
        [--code DIR] [--repeat 3]

A project is made in ``--dir`` (a fresh temporary folder by default): ``test_scale.py`` with ``test_judged``, which
records ``--judged`` metrics, and a baseline file written by three real ``--moeperf-update`` sessions of it, then
grown to ``--metrics`` metrics by copies of its entries under other tests' keys (``test_other[cN]``), each with
``--runs`` runs and the same provenance a real update writes. Then, each ``--repeat`` times, in a fresh process:

* **judge**: ``pytest test_scale.py`` (every judged metric PASS, exit 0);
* **update**: ``pytest test_scale.py --moeperf-update`` (the file rewritten with one more run of the judged metrics;
  restored afterwards, so each repetition starts from the same file).

Wall time, CPU time (user + system: less at the mercy of other work on a shared box) and the peak resident memory of
the pytest process (``wait4``'s ``ru_maxrss``) are printed, the median of the repetitions. ``--code DIR`` runs the
sessions with another checkout's ``pytest_moeperf`` first on the path (to measure the code before a change; e.g.
``git archive main pytest_moeperf | tar -x -C DIR``); by default, this checkout's. A ``--dir`` that holds the grown
file already is reused as it is. The figures are quoted, with the machine they came from, in
``docs/measurements/baseline-scale.md``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

TEST = """
import os

M = int(os.environ["MOEPERF_SCALE_JUDGED"])

def test_judged(perf):
    for i in range(M):
        perf.record(f"t{i}", [1.0, 1.01, 0.99, 1.0, 1.02], unit="ms")
"""
SESSION = ("-q", "-p", "no:cacheprovider", "--moeperf-health", "off", "--moeperf-history", "off", "test_scale.py")


def run(project: Path, code: Path, judged: int, *args: str) -> tuple[float, float, float, str]:
    """One pytest session in ``project``: (wall seconds, CPU seconds, peak RSS in MiB, its output); fails on a
    non-zero exit."""
    env = {**os.environ, "PYTHONPATH": str(code), "MOEPERF_SCALE_JUDGED": str(judged)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "pytest", *SESSION, *args], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    seconds = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"pytest {' '.join(args)} exited {proc.returncode}:\n{out[-4000:]}")
    return seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, out


def make_project(project: Path, code: Path, metrics: int, judged: int, runs: int) -> None:
    """The project and its grown baseline file."""
    (project / "pytest.ini").write_text("[pytest]\n")
    (project / "test_scale.py").write_text(TEST)
    for _ in range(3):
        run(project, code, judged, "--moeperf-update")
    path = next((project / "baselines").glob("*/test_scale.json"))
    doc = json.loads(path.read_text())
    model = next(iter(doc["metrics"].values()))
    model["runs"] = (model["runs"] * runs)[:runs]
    for i in range(metrics - judged):
        test = f"test_scale.py::test_other[c{i}]"
        doc["metrics"][f"{test}::t"] = {**model, "test": test}
    path.write_text(json.dumps(doc, indent=2, sort_keys=True) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--metrics", type=int, default=100_000, help="metrics in the baseline file (default: %(default)s)")
    p.add_argument("--judged", type=int, default=100, help="metrics the session measures (default: %(default)s)")
    p.add_argument("--runs", type=int, default=3, help="stored runs of each filler metric (default: %(default)s)")
    p.add_argument("--dir", type=Path, default=None, help="the project's folder (default: a temporary one)")
    p.add_argument("--code", type=Path, default=ROOT, help="checkout whose pytest_moeperf runs (default: this one)")
    p.add_argument("--repeat", type=int, default=3, help="sessions of each kind; the median is shown")
    args = p.parse_args(argv)
    project = args.dir or Path(tempfile.mkdtemp(prefix="moeperf-scale-"))
    project.mkdir(parents=True, exist_ok=True)
    path = project / "baselines"
    if not any(path.glob("*/test_scale.json")):  # a --dir made before is reused as it is
        make_project(project, args.code, args.metrics, args.judged, args.runs)
    path = next(path.glob("*/test_scale.json"))
    print(f"{path}: {args.metrics} metrics, {path.stat().st_size / 1e6:.0f} MB; code {args.code}; "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    keep = path.with_suffix(".orig")
    shutil.copyfile(path, keep)
    for kind, extra in (("judge", ()), ("update", ("--moeperf-update",))):
        results = []
        for _ in range(args.repeat):
            results.append(run(project, args.code, args.judged, *extra)[:3])
            shutil.copyfile(keep, path)
        wall, cpu, mib = (statistics.median(r[i] for r in results) for i in range(3))
        print(f"{kind}: {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {mib:.0f} MiB (median of {len(results)}: "
              f"{', '.join(f'{r[0]:.1f} s/{r[1]:.1f} s/{r[2]:.0f} MiB' for r in results)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
