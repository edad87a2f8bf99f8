"""A perf history from real suite runs, for the dashboard: CPU GEMM and all-reduce (``-m "gemm or allreduce"
--moeperf-quick``), two hosts by ``--moeperf-host-id`` taking turns, and a known +10 % step in the middle.

Each session runs on its own commit: the suites run from a scratch clone of this checkout (``OUT/repo``), and before
each session the script commits one line to ``OUT/repo/SESSIONS.md``; the session's provenance
(`machine.provenance.git_commit_info`, the rootdir's ``git rev-parse HEAD``) then names that commit. From session
``--step-at`` on, the test-only plugin ``moeperf_inject`` makes every GEMM metric ``--factor`` worse
(``MOEPERF_INJECT``), and that session's commit message says so: the step's "right commit" on each host is the first
commit that host measured with the injection. ``OUT/expected.json`` records those commits.

    python tests/benchmarks/dashboard_history.py --out /tmp/dash-history [--sessions 32] [--step-at 16]

The code measured is the clone's (``PYTHONPATH``): this checkout's committed code when the script started. Progress
goes to stdout, one line a session; a failed session stops the script (its log is kept in ``OUT/logs``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HOSTS = ("host-a", "host-b")


def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="folder for the clone, the logs and the history")
    parser.add_argument("--sessions", type=int, default=32, help="sessions in all (default: %(default)s)")
    parser.add_argument("--step-at", type=int, default=16, help="first injected session, 0-based (default: "
                        "%(default)s)")
    parser.add_argument("--factor", type=float, default=1.10, help="how much worse (default: %(default)s)")
    parser.add_argument("--glob", default="suites/gemm/test_gemm.py::*", help="metrics injected (default: "
                        "%(default)s)")
    parser.add_argument("--python", default=sys.executable, help="the interpreter that runs pytest")
    args = parser.parse_args()
    out = args.out.resolve()
    repo, logs, history = out / "repo", out / "logs", out / "history.sqlite"
    if out.exists() and any(out.iterdir()):
        parser.error(f"--out {out} exists and is not empty: pick a new folder (nothing is overwritten)")
    logs.mkdir(parents=True)
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(ROOT), str(repo)], check=True)
    git(repo, "checkout", "--quiet", "-B", "main")
    for key, value in (("user.name", "moeperf dashboard history"), ("user.email", "history@moeperf.invalid")):
        git(repo, "config", key, value)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GITHUB_", "MOEPERF_"))}
    env["PYTHONPATH"] = os.pathsep.join([str(repo), str(repo / "tests" / "benchmarks")])  # the clone: this
    # checkout can change while the history is made
    expected: dict[str, object] = {"glob": args.glob, "factor": args.factor, "step_at": args.step_at,
                                   "sessions": [], "step_commit": {}}
    started = time.monotonic()
    for index in range(args.sessions):
        host = HOSTS[index % len(HOSTS)]
        injected = index >= args.step_at
        note = f"session {index} on {host}" + (f": {args.glob} {args.factor:g}x worse (MOEPERF_INJECT)"
                                               if injected else "")
        with (repo / "SESSIONS.md").open("a") as f:
            f.write(note + "\n")
        git(repo, "add", "SESSIONS.md")
        git(repo, "commit", "--quiet", "-m", note)
        commit = git(repo, "rev-parse", "HEAD")
        run_env = dict(env, MOEPERF_INJECT=f"{args.glob}={args.factor}") if injected else env
        command = [args.python, "-m", "pytest", "suites", "-m", "gemm or allreduce", "--moeperf-quick", "-q",
                   "-p", "no:cacheprovider", "--moeperf-history", str(history), "--moeperf-host-id", host]
        if injected:
            command[4:4] = ["-p", "moeperf_inject"]
        log = logs / f"session-{index:02d}.log"
        with log.open("w") as f:
            done = subprocess.run(command, cwd=repo, env=run_env, stdout=f, stderr=subprocess.STDOUT)
        if done.returncode not in (0, 1):  # 1: a test failed (a REGRESSED verdict fails its test); still recorded
            print(f"session {index}: pytest exit {done.returncode}; see {log}", flush=True)
            return 1
        sessions = expected["sessions"]
        assert isinstance(sessions, list)
        sessions.append({"index": index, "host": host, "commit": commit, "injected": injected})
        step = expected["step_commit"]
        assert isinstance(step, dict)
        if injected and host not in step:
            step[host] = commit
        (out / "expected.json").write_text(json.dumps(expected, indent=2) + "\n")
        print(f"[{time.monotonic() - started:6.0f} s] session {index + 1}/{args.sessions} {host} {commit[:10]} "
              f"{'injected' if injected else 'clean'} exit {done.returncode}", flush=True)
    print(f"history: {history}; expected change points: {expected['step_commit']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
