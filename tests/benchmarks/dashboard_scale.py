"""How the dashboard scales: a SQLite history of 10,000 sessions x 1,000 metrics (10 M metric rows), filled through
the history store (`HistoryStore.append`, one transaction a session), then ``moeperf dashboard`` built from it
(timed per phase), then its index and a metric page loaded in headless Chromium (timed: navigation to the load
event, after which the page has drawn).

    python tests/benchmarks/dashboard_scale.py --db /tmp/scale.sqlite --out /tmp/scale-site [--sessions 10000]
        [--metrics 1000] [--hosts 2] [--window 100] [--loads 5]

A ``--db`` that already holds the sessions is reused (filling takes minutes). The metrics: 20 families (10 test
files in 4 suites, 2 metric names each) of 50 cases; 1 % Gaussian noise; one family 10 % slower from the middle on.
Results go to stdout; ``docs/dashboard.md`` quotes them with the machine they came from.
"""

from __future__ import annotations

import argparse
import datetime as dt
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pytest_moeperf.dashboard.build import Options, guarded  # noqa: E402
from pytest_moeperf.dashboard.changes import default_jobs  # noqa: E402
from pytest_moeperf.dashboard.model import page_of  # noqa: E402
from pytest_moeperf.history.records import MetricRecord, SessionRecord  # noqa: E402
from pytest_moeperf.history.store import HistoryStore  # noqa: E402
from tests.dashboard import chromium  # noqa: E402

SUITES = ("gemm", "allreduce", "serving", "specdecode")


def keys(count: int) -> list[tuple[str, str]]:
    """``(test_id, name)`` for ``count`` metrics: 10 files x 2 names x count/20 cases."""
    cases = max(1, count // 20)
    found = []
    for f in range(10):
        path = f"suites/{SUITES[f % len(SUITES)]}/test_file{f}.py"
        for name in ("time", "throughput"):
            found += [(f"{path}::test_case[c{c}]", name) for c in range(cases)]
    return found[:count]


def fill(target: str, sessions: int, metrics: int, hosts: int) -> None:
    rng = random.Random(3)
    chosen = keys(metrics)
    base = [rng.uniform(10, 1000) for _ in chosen]
    start = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
    clock = time.perf_counter()
    with HistoryStore.open(target) as store:
        # a benchmark's fixture, not a history to keep: no fsync per session (the rows go in the same way)
        # and the key index built once at the end instead of updated by every session (same schema, same rows)
        store.conn.execute("PRAGMA synchronous = OFF")
        store.conn.execute("PRAGMA journal_mode = WAL")
        store.conn.execute("PRAGMA cache_size = -1000000")
        store.conn.execute("DROP INDEX moeperf_metrics_key")
        for i in range(sessions):
            run = SessionRecord(finished=(start + dt.timedelta(minutes=30 * i)).isoformat(timespec="seconds"),
                                fingerprint="8x-h200", fingerprint_hash="feedfacecafe", git_commit=f"{i:040x}",
                                host="node", versions={"torch": "2.13.0", "vllm": "0.32.0"},
                                host_id=f"host-{i % hosts}", branch="main")
            rows = []
            for (test_id, name), b in zip(chosen, base, strict=True):
                stepped = test_id.startswith("suites/gemm/test_file0.py") and name == "time" and i >= sessions // 2
                value = b * (1.1 if stepped else 1.0) * (1 + rng.gauss(0, 0.01))
                rows.append(MetricRecord(test_id=test_id, name=name, unit="us", better="lower", median=value, n=7,
                                         iqr=value * 0.01, status="PASS", change=value / b - 1, allowed=0.05,
                                         baseline=b))
            store.append(run, rows)
            if (i + 1) % 500 == 0:
                print(f"filled {i + 1}/{sessions} sessions ({time.perf_counter() - clock:.0f} s)", flush=True)
        store.conn.execute("CREATE INDEX moeperf_metrics_key ON moeperf_metrics (test_id, name)")
    print(f"fill: {sessions} sessions x {metrics} metrics in {time.perf_counter() - clock:.0f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--metrics", type=int, default=1_000)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--window", type=int, default=50, help="sessions per host shown (--sessions of the build)")
    parser.add_argument("--jobs", type=int, default=default_jobs())
    parser.add_argument("--loads", type=int, default=5, help="page loads timed in Chromium")
    args = parser.parse_args()
    target = str(args.db)
    if args.db.exists():
        with HistoryStore.open(target) as store:
            have = len(store.sessions())
        print(f"reusing {args.db}: {have} sessions ({args.db.stat().st_size / 2**30:.2f} GiB)")
    else:
        fill(target, args.sessions, args.metrics, args.hosts)
        print(f"{args.db}: {args.db.stat().st_size / 2**30:.2f} GiB")
    clock = time.perf_counter()
    built = guarded(Options(target=target, out=args.out, sessions=args.window, jobs=args.jobs),
                    lambda line: print(f"  {line}", flush=True))
    total = time.perf_counter() - clock
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in built.seconds.items())
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    index_size = (args.out / "index.html").stat().st_size
    print(f"build: {total:.1f} s ({phases}) with {args.jobs} process(es): {built.families} families, "
          f"{built.metrics} metrics, {built.shown} of {built.total} sessions, {built.change_points} change points; "
          f"site {size / 2**20:.1f} MiB, index.html {index_size / 2**10:.0f} KiB")
    executable = chromium.binary()
    if executable is None:
        print("load: skipped, Chromium is not installed (apt-get install chromium)")
        return 0
    metric = args.out / page_of(keys(args.metrics)[0][0] + "::time")
    with chromium.browser(executable) as browser:
        page = browser.page()
        for name, path in (("index", args.out / "index.html"), ("metric page", metric)):
            times, drawn = [], []
            for _ in range(args.loads):
                times.append(page.goto(chromium.url(path)))
                drawn.append(page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd"))
                assert page.evaluate("document.body.dataset.rendered") == "1"
            print(f"load {name}: median {statistics.median(times):.2f} s to the load event (max {max(times):.2f} s);"
                  f" in-page loadEventEnd median {statistics.median(drawn):.0f} ms, over {args.loads} loads")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
