"""``moeperf dashboard --db URL|PATH --out DIR``: the static dashboard of a perf history."""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlsplit

from pytest_moeperf.dashboard.build import DEFAULT_SESSIONS, DEFAULT_SPARK, DashboardError, Options, guarded
from pytest_moeperf.dashboard.changes import default_jobs
from pytest_moeperf.history.cli import ENV, default_target
from pytest_moeperf.history.trend import MAX_PVALUE, MIN_MAGNITUDE
from pytest_moeperf.settings.checks import at_least, describe, number_in, pvalue


def commit_template(text: str) -> str:
    """An http(s) URL with ``{commit}`` in it: the pages link each commit with it (``javascript:``, ``data:`` or a
    relative link would run or load whatever it names from the dashboard's page)."""
    if "{commit}" not in text:
        raise argparse.ArgumentTypeError(f"expected a URL with {{commit}} in it, got {text!r}")
    try:
        parts = urlsplit(text.replace("{commit}", "0" * 40))
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r} is not a URL ({exc})") from None
    controls = any(ord(c) < 0x20 or 0x7F <= ord(c) < 0xA0 for c in text)  # a browser drops some: "java\tscript:"
    if parts.scheme.lower() not in ("http", "https") or not parts.netloc or text.strip() != text or controls:
        raise argparse.ArgumentTypeError(f"expected an http:// or https:// URL with a host, such as "
                                         f"https://github.com/ORG/REPO/commit/{{commit}}, got {text!r}")
    return text


def ci_commit_url() -> str | None:
    """GitHub Actions' own repository, when the build runs there."""
    server, repository = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    return f"{server}/{repository}/commit/{{commit}}" if server and repository else None


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="moeperf dashboard", description="Build a static perf dashboard (HTML, no "
                                "server, no network at view time) from a history database.")
    p.add_argument("--db", metavar="URL|PATH", default=None,
                   help=f"history database: a SQLite path or postgresql://… URL (default: ${ENV}, else "
                        f"{default_target()})")
    p.add_argument("--out", type=Path, required=True, metavar="DIR",
                   help="the site's folder: new, empty, or an earlier dashboard (replaced; the files no build wrote, "
                        "such as a CNAME, are kept and named); a symlink to one is followed and kept")
    p.add_argument("--sessions", type=at_least(3), default=DEFAULT_SESSIONS, metavar="N",
                   help="the last N sessions of each host are shown (default: %(default)s)")
    p.add_argument("--spark", type=at_least(2), default=DEFAULT_SPARK, metavar="N",
                   help="sessions in an index sparkline (default: %(default)s)")
    p.add_argument("--ab", action="append", type=Path, default=[], metavar="FILE|DIR",
                   help="moeperf ab --report documents (or folders of them; regular files of at most 64 MiB), "
                        "shown beside the sessions of their head commit; repeatable")
    p.add_argument("--commit-url", type=commit_template, default=None, metavar="TEMPLATE",
                   help="link each commit, e.g. https://github.com/ORG/REPO/commit/{commit} (default: this "
                        "GitHub Actions run's repository, else no link)")
    p.add_argument("--max-pvalue", type=pvalue, default=MAX_PVALUE, metavar="P",
                   help="significance of a change point (default: %(default)s, as moeperf trend)")
    p.add_argument("--min-magnitude", type=number_in(0.0), default=MIN_MAGNITUDE, metavar="FRAC",
                   help="smallest relative step shown (default: %(default)s, as moeperf trend)")
    p.add_argument("--title", default="moeperf dashboard", help="the index page's title (default: %(default)s)")
    p.add_argument("--jobs", type=at_least(1), default=None, metavar="N",
                   help="processes finding change points (default: the CPUs this process may use)")
    return p


def main_dashboard(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    options = Options(target=args.db or default_target(), out=args.out, sessions=args.sessions, spark=args.spark,
                      jobs=args.jobs or default_jobs(), ab=tuple(args.ab),
                      commit_url=args.commit_url or ci_commit_url(), title=args.title,
                      max_pvalue=args.max_pvalue, min_magnitude=args.min_magnitude)
    start = time.perf_counter()
    try:
        built = guarded(options, lambda line: print(f"moeperf dashboard: {line}", file=sys.stderr, flush=True))
    except DashboardError as exc:
        print(f"moeperf dashboard: {describe(exc)}; nothing written to {args.out}", file=sys.stderr)
        return 2
    phases = ", ".join(f"{k} {v:.1f} s" for k, v in built.seconds.items())
    print(f"wrote {built.out}/index.html: {built.families} families, {built.metrics} metrics, {built.shown} of "
          f"{built.total} sessions, {built.change_points} change points ({time.perf_counter() - start:.1f} s: "
          f"{phases})")
    return 0
