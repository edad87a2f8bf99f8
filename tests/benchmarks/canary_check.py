"""Does CI stay green on the machine and red on the code? (a measurement, not a test: run it by hand on a quiet box)

    python tests/benchmarks/canary_check.py [--runs 6] [--factor 1.15] [--case TEST] [--also KEY=FACTOR ...]
                                            [--python PY] [--ref REV] [--out DIR] [--no-settle] [-- PYTEST ARGS]

Issue 38's bar: six clean-clone runs in a row of the README's suites command, each exit 0 with 0 REGRESSED, while a
x1.15 injected into one GEMM case by a test-only plugin (``moeperf_inject``) is REGRESSED in each. A run passes when
the injected case's ``time`` is REGRESSED and nothing else is REGRESSED or failed (its exit code is then 1, for the
injected test alone); with ``--factor 1`` (nothing injected) when it exits 0 with 0 REGRESSED. Each run:

1. ``git clone`` of ``--repo`` (default: this checkout) at ``--ref`` (default HEAD: commit what you measure) into a
   fresh directory: the committed baselines, no history, no ``.tox``;
2. waits, as ``.ci/run`` does, until the 1-minute load average is below 0.3 (at most 5 minutes; ``--no-settle``);
3. runs tox.ini's ``[testenv:suites]`` commands there (``moeperf topology``, then ``python -m pytest suites
   --moeperf-report … --moeperf-markdown … --moeperf-html … -q -rs``) with ``--python`` (default: this interpreter;
   the clone's package first on the path, as ``.ci/run`` runs them in the env ``tox -e tests`` built) and
   ``-p moeperf_inject`` with ``MOEPERF_INJECT`` making every metric of test ``--case`` ``--factor`` worse;
   PYTEST ARGS are appended (a tiny selection: ``-- -m gemm -k "o_proj-m1-bf16 or router-m1-bf16"``);
4. reads its JSON report: the exit code, the REGRESSED metrics and failed tests other than the injected case's,
   whether the injected case's ``time`` is REGRESSED (and its change), the verdicts the canary made INCONCLUSIVE
   (cause machine), and the canary's figures (per test file and workload: current, stored, change, state).

``--also KEY=FACTOR`` (repeatable) injects one more metric, e.g. a serving metric x1.10 (issue 39: a synthetic
x1.10 still caught under the learned plan of starts x windows); a run passes only if each is REGRESSED too, and the
other metrics of its test are the run's A/A like the rest.

A table per run and the totals go to stdout and ``DIR/summary.txt``; ``DIR/summary.json`` has the same; each run's
report, log and Markdown stay in ``DIR/run-K/``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
#: one M=1 bf16 GEMM case: the sub-family a clean-clone CI read +12-19 % while the rest of the family did not move
DEFAULT_CASE = "suites/gemm/test_gemm.py::test_gemm[kimi-k2.5-o_proj-m1-bf16]"
CANARY = "::moeperf_canary::"


def settle(limit_s: float = 300.0, below: float = 0.3) -> str:
    """Wait until the 1-minute load average is below ``below`` (at most ``limit_s``), as .ci/run does."""
    start = time.monotonic()
    while os.getloadavg()[0] > below and time.monotonic() - start < limit_s:
        time.sleep(5)
    return f"load average {os.getloadavg()[0]:.2f} after {time.monotonic() - start:.0f} s"


def clone(repo: Path, ref: str, into: Path) -> str:
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(into)], check=True)
    subprocess.run(["git", "-C", str(into), "checkout", "--quiet", "--detach", ref], check=True)
    return subprocess.run(["git", "-C", str(into), "rev-parse", "--short", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()


def suites_command(python: str, out: Path, extra: Sequence[str]) -> list[str]:
    """tox.ini's [testenv:suites] pytest command, its files in ``out``, with the injection plugin."""
    return [python, "-m", "pytest", "suites", "--moeperf-report", str(out / "report.json"), "--moeperf-markdown",
            str(out / "summary.md"), "--moeperf-html", str(out / "report.html"), "-q", "-rs", "-p", "moeperf_inject",
            *extra]


def summarize(doc: Mapping[str, Any], case: str, also: Sequence[str] = ()) -> dict[str, Any]:
    """What one run's JSON report says: REGRESSED metrics other than the injected case's, the injected case's
    ``time`` verdict, the verdicts the canary made INCONCLUSIVE, and the canary's figures."""
    section = doc.get("moeperf") or {}
    entries = [*doc.get("benchmarks", []), *section.get("non_time_benchmarks", [])]
    causes = {r["verdict"]["key"]: r["verdict"].get("cause", "") for r in section.get("records", [])
              if r.get("verdict")}
    verdicts = {b["fullname"]: b["extra_info"] for b in entries}
    regressed = sorted(k for k, v in verdicts.items() if v.get("verdict") == "REGRESSED"
                       and not k.startswith(f"{case}::") and k not in also and CANARY not in k)
    time_key = f"{case}::time"
    canary = [{"file": k.split(CANARY)[0], "workload": k.split(CANARY)[1], "current": v.get("metric_stats", {}).get(
        "median"), "stored": v.get("baseline_median"), "runs": v.get("baseline_runs"), "change": v.get("change"),
        "state": v.get("verdict")} for k, v in sorted(verdicts.items()) if CANARY in k]
    also_tests = {key.rsplit("::", 1)[0] for key in also}
    failed = sorted(t for t, why in (section.get("tests") or {}).items()
                    if why.startswith(("test failed", "test errored")) and t != case and t not in also_tests)
    return {"regressed": regressed, "failed": failed,
            "also": {key: [verdicts.get(key, {}).get("verdict", "absent"), verdicts.get(key, {}).get("change")]
                     for key in also},
            "injected": verdicts.get(time_key, {}).get("verdict", "absent"),
            "injected_change": verdicts.get(time_key, {}).get("change"),
            "machine": sorted(k for k, c in causes.items()
                              if c == "machine" and verdicts.get(k, {}).get("verdict") == "INCONCLUSIVE"),
            "inconclusive": sum(1 for k, v in verdicts.items()
                                if v.get("verdict") == "INCONCLUSIVE" and CANARY not in k),
            "canary": canary}


def ok(run: Mapping[str, Any]) -> bool:
    """Whether a run meets the bar (the module docstring)."""
    if run["factor"] == 1:
        return bool(run["exit"] == 0 and not run["regressed"])
    return bool(not run["regressed"] and not run["failed"] and run["injected"] == "REGRESSED" and run["exit"] in (0, 1)
                and all(verdict == "REGRESSED" for verdict, _ in run.get("also", {}).values()))


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.1f} %"


def lines(run: Mapping[str, Any]) -> list[str]:
    out = [f"run {run['run']} ({run['commit']}, {run['settled']}, {run['seconds']:.0f} s): exit {run['exit']}, "
           f"{len(run['regressed'])} REGRESSED and {len(run['failed'])} failed test(s) besides the injected case, "
           f"injected x{run['factor']:g} "
           f"{run['injected']} ({_pct(run['injected_change'])}), {len(run['machine'])} INCONCLUSIVE cause machine "
           f"(of {run['inconclusive']} INCONCLUSIVE)"]
    out += [f"    injected x{run['also_factors'][key]:g} {key}: {verdict} ({_pct(change)})"
            for key, (verdict, change) in run.get("also", {}).items()]
    out += [f"    REGRESSED {key}" for key in run["regressed"]] + [f"    failed {t}" for t in run["failed"]]
    out += [f"    canary {c['file']} {c['workload']}: {c['current']} us, stored {c['stored']} ({c['runs']} runs), "
            f"{_pct(c['change'])}, {c['state']}" for c in run["canary"]]
    return out


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    extra = args[args.index("--") + 1:] if "--" in args else []
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--runs", type=int, default=6)
    parser.add_argument("--factor", type=float, default=1.15)
    parser.add_argument("--case", default=DEFAULT_CASE, help="the test whose metrics are made worse")
    parser.add_argument("--also", action="append", default=[], metavar="KEY=FACTOR",
                        help="one more metric (<test id>::<metric>) made FACTOR worse; repeatable")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--repo", type=Path, default=HERE.parents[1])
    parser.add_argument("--ref", default="HEAD")
    parser.add_argument("--out", type=Path, default=Path("canary-check"))
    parser.add_argument("--no-settle", action="store_true")
    parser.add_argument("--timeout", type=float, default=7200.0, help="seconds a run may take")
    opts = parser.parse_args(args[:args.index("--")] if "--" in args else args)
    if os.sep in opts.python:  # a path: the runs happen in the clone, so resolve it here
        opts.python = os.path.abspath(opts.python)  # not resolve(): a venv python is a symlink out of its venv
    also: dict[str, float] = {}
    for item in opts.also:
        key, _, factor = item.rpartition("=")
        if "::" not in key or not factor.replace(".", "", 1).isdigit():
            parser.error(f"--also: expected <test id>::<metric>=FACTOR, got {item!r}")
        also[key] = float(factor)
    out = opts.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = []
    for k in range(1, opts.runs + 1):
        folder = out / f"run-{k}"
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        with tempfile.TemporaryDirectory(prefix="canary-check-") as tmp:
            checkout = Path(tmp) / "clone"
            commit = clone(opts.repo.resolve(), opts.ref, checkout)
            settled = "not waited" if opts.no_settle else settle()
            env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "tests" / "benchmarks"),
                                                                 os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                   "MOEPERF_INJECT": ",".join([f"{glob.escape(opts.case)}::*={opts.factor}",
                                               *(f"{glob.escape(key)}={f}" for key, f in also.items())])}
            started = time.monotonic()
            with (folder / "log.txt").open("w") as log:
                subprocess.run([opts.python, "-m", "pytest_moeperf.cli", "topology"], cwd=checkout, env=env,
                               stdout=log, stderr=subprocess.STDOUT)
                done = subprocess.run(suites_command(opts.python, folder, extra), cwd=checkout, env=env, stdout=log,
                                      stderr=subprocess.STDOUT, timeout=opts.timeout)
        report = folder / "report.json"
        found = summarize(json.loads(report.read_text()), opts.case, list(also)) if report.exists() else {
            "regressed": [], "failed": [], "injected": "no report", "injected_change": None, "machine": [],
            "inconclusive": 0, "canary": [], "also": {key: ["no report", None] for key in also}}
        run = {"run": k, "commit": commit, "settled": settled, "seconds": time.monotonic() - started,
               "exit": done.returncode, "factor": opts.factor, "also_factors": also, **found}
        runs.append(run)
        print("\n".join(lines(run)), flush=True)
    passed = [r for r in runs if ok(r)]
    total = (f"{len(passed)} of {len(runs)} runs " + ("exit 0 with 0 REGRESSED" if opts.factor == 1 else
             "pass: nothing REGRESSED or failed besides the injected case, and it is REGRESSED"))
    print(total)
    (out / "summary.txt").write_text("\n".join([line for r in runs for line in lines(r)] + [total]) + "\n")
    (out / "summary.json").write_text(json.dumps({"runs": runs, "passed": len(passed), "case": opts.case,
                                                  "factor": opts.factor, "also": also, "extra": extra},
                                                 indent=2) + "\n")
    return 0 if len(passed) == len(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
